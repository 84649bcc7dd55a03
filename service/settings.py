"""Service settings, read once from the environment (prefix ``TORCHYARD_``) and injected."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.jobtoken import hash_token

API_TOKEN_MIN_CHARS = 16
# Never passed on to a job's shim or ranks (jobs run user code; see docs/security.md).
# TORCHYARD_TOKEN is the CLI's (a server started from an operator's shell may have it).
SECRET_ENV_VARS = frozenset(
    {"TORCHYARD_API_TOKENS", "TORCHYARD_API_TOKENS_FILE", "TORCHYARD_TOKEN",
     "TORCHYARD_SECRETS_FILE"}
)


def _comma_list(value: object) -> object:
    """``"a, b,,c"`` → ``["a", "b", "c"]`` (env values are comma lists, not JSON)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def environ_for_children(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the server's secrets: what a job's processes may inherit."""
    return {k: v for k, v in environ.items() if k not in SECRET_ENV_VARS}


def split_dirs(value: str | None) -> list[str]:
    """``'a:b,c'`` → ``['a', 'b', 'c']`` (os.pathsep or comma; blanks dropped)."""
    if not value:
        return []
    return [p.strip() for p in value.replace(",", os.pathsep).split(os.pathsep) if p.strip()]


class Settings(BaseSettings):
    """Everything the service can be configured with. Built by ``Settings()`` at the edge only."""

    # hide_input_in_errors: a refused token must not be echoed into logs.
    model_config = SettingsConfigDict(
        env_prefix="TORCHYARD_", extra="ignore", hide_input_in_errors=True
    )

    home: Path = Field(
        default=Path(".torchyard"),
        description="directory of the SQLite database (torchyard.db) and the run directories "
        "(runs/ID/)",
    )
    database_url: str | None = Field(
        default=None,
        description="any SQLAlchemy URL; unset = SQLite at HOME/torchyard.db (WAL, foreign keys, "
        "busy timeout)",
    )
    host: str = Field(
        default="127.0.0.1",
        description="address `torchyard serve` binds; a non-loopback one needs API tokens "
        "(or --insecure)",
    )
    port: int = Field(default=8000, ge=0, le=65535, description="port `torchyard serve` binds")
    public_url: str | None = Field(
        default=None,
        description="URL the ranks post their records to; unset = http://HOST:PORT "
        "(127.0.0.1 when HOST is a wildcard address)",
    )
    gpus: str | None = Field(
        default=None,
        description="GPU indices to schedule, e.g. '0,1,3', or 'none'; unset = found with "
        "nvidia-smi at start (the server never imports torch)",
    )
    cpu_slots: int = Field(
        default_factory=lambda: os.cpu_count() or 1,
        ge=1,
        le=4096,
        description="CPU slots to schedule CPU jobs on (one per rank); unset = the number of "
        "CPU cores",
    )
    poll_interval_s: float = Field(
        default=0.2,
        gt=0,
        le=10,
        description="longest the supervisor sleeps between passes when nothing wakes it",
    )
    stop_grace_s: float = Field(
        default=10.0,
        ge=0,
        le=600,
        description="seconds between SIGTERM and SIGKILL when a job is cancelled or stopped",
    )
    python_executable: str | None = Field(
        default=None,
        description="Python interpreter that runs torchrun and the ranks; unset = the server's "
        "own",
    )
    executor: Literal["local"] = Field(
        default="local",
        description="what runs jobs: 'local' = a torchrun process group per job on this host",
    )
    script_dirs: str | None = Field(
        default=None,
        description="directories script jobs may run from, separated by ':' (os.pathsep) or ','; "
        "each must exist and may not be the filesystem root; unset = script jobs disabled",
    )

    @field_validator("script_dirs")
    @classmethod
    def _script_dirs_exist(cls, value: str | None) -> str | None:
        for part in split_dirs(value):
            path = Path(part).resolve()
            if not path.is_dir():
                raise ValueError(f"TORCHYARD_SCRIPT_DIRS: {part!r} is not a directory")
            if path == Path(path.anchor):
                raise ValueError("TORCHYARD_SCRIPT_DIRS: the filesystem root is not allowed")
        return value

    @property
    def script_dir_list(self) -> list[Path]:
        """The resolved script directories, in order; empty = script jobs disabled."""
        return [Path(part).resolve() for part in split_dirs(self.script_dirs)]
    # --- security (docs/security.md) ------------------------------------------------------------
    api_tokens: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        repr=False,
        description="API bearer tokens, comma-separated, 16+ characters each; when set (or a "
        "tokens file is), every route but /healthz and the dashboard shell needs one. Only "
        "their SHA-256 digests are kept",
    )
    api_tokens_file: Path | None = Field(
        default=None,
        description="file of API tokens, one a line, '#' comments; missing or empty = the "
        "server refuses to start",
    )
    cors_origins: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="origins allowed cross-origin access (CORS), comma-separated; unset = none",
    )
    max_body_bytes: int = Field(
        default=1024 * 1024,
        ge=1024,
        le=1024**3,
        description="largest request body accepted; larger is 413 (declared or streamed)",
    )
    data_dirs: Annotated[list[Path], NoDecode] = Field(
        default_factory=list,
        description="directories a job's dataset_root must lie in, comma-separated (a relative "
        "dataset_root is taken inside the first); unset = HOME/data",
    )
    secrets_file: Path | None = Field(
        default=None,
        description="JSON object of secret name → value that script jobs name in secret_env; "
        "read at each submit and launch; unset = no secrets (docs/security.md)",
    )
    worker_token_grace_s: float = Field(
        default=60.0,
        ge=0,
        le=3600,
        description="seconds a job's token may still post records after the job ended",
    )

    _split_lists = field_validator("api_tokens", "cors_origins", "data_dirs", mode="before")(
        _comma_list
    )

    @field_validator("api_tokens")
    @classmethod
    def _hash_at_once(cls, tokens: list[str]) -> list[str]:
        """Only SHA-256 digests stay in memory; a short (guessable) token is refused."""
        if any(len(t) < API_TOKEN_MIN_CHARS for t in tokens):
            raise ValueError(f"every API token needs at least {API_TOKEN_MIN_CHARS} characters")
        return [hash_token(t) for t in tokens]

    @property
    def api_tokens_configured(self) -> bool:
        """Tokens are on when either source is set (an unreadable or empty file fails closed)."""
        return bool(self.api_tokens) or self.api_tokens_file is not None

    def api_token_digests(self) -> frozenset[str]:
        """SHA-256 hex digests of every configured token; the tokens themselves are not kept.

        Raises ``ValueError`` when a tokens file is configured but missing, empty or holds a
        short token: the server must not start open when its operator asked for tokens.
        """
        digests = set(self.api_tokens)
        if self.api_tokens_file is not None:
            try:
                lines = self.api_tokens_file.read_text().splitlines()
            except OSError as exc:
                raise ValueError(f"api_tokens_file: cannot read {self.api_tokens_file}: {exc}")
            from_file = [ln.strip() for ln in lines if ln.strip() and not ln.startswith("#")]
            if not from_file:
                raise ValueError(f"api_tokens_file: {self.api_tokens_file} holds no tokens")
            if any(len(t) < API_TOKEN_MIN_CHARS for t in from_file):
                raise ValueError(f"api_tokens_file: tokens need {API_TOKEN_MIN_CHARS}+ characters")
            digests.update(hash_token(t) for t in from_file)
        return frozenset(digests)

    @property
    def data_roots(self) -> list[Path]:
        """Directories a job's ``dataset_root`` must lie in (``HOME/data`` if none configured)."""
        return list(self.data_dirs) or [self.home / "data"]

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'torchyard.db').resolve()}"

    def api_url_for_workers(self, bound_port: int | None = None) -> str:
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        return f"http://{host}:{bound_port or self.port}"
