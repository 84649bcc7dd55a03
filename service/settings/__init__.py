"""Service settings, read once from the environment (prefix ``TORCHYARD_``) and injected."""

import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.settings.groups import (
    PackageSettings,
    SlurmSettings,
    TrackingSettings,
    WebhookSettings,
)
from service.settings.identity import IdentitySettings
from service.settings.tokens import hash_token

API_TOKEN_MIN_CHARS = 16

def _comma_list(value: object) -> object:
    """``"a, b,,c"`` → ``["a", "b", "c"]`` (env values are comma lists, not JSON)."""
    if isinstance(value, str):
        return [part.strip() for part in value.split(",") if part.strip()]
    return value


def split_dirs(value: str | None) -> list[str]:
    """``'a:b,c'`` → ``['a', 'b', 'c']`` (os.pathsep or comma; blanks dropped)."""
    if not value:
        return []
    return [p.strip() for p in value.replace(",", os.pathsep).split(os.pathsep) if p.strip()]


class Settings(
    SlurmSettings, PackageSettings, WebhookSettings, TrackingSettings, IdentitySettings,
    BaseSettings,
):
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
        description="SQLAlchemy URL of the store: unset = SQLite at HOME/torchyard.db (WAL, "
        "foreign keys, busy timeout); or PostgreSQL as postgresql+psycopg://USER:PASSWORD@HOST/DB "
        "(the `postgres` extra; docs/operations.md)",
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
        description="longest the supervisor sleeps between passes when nothing wakes it while "
        "a job is unfinished or a sweep runs; with none it passes once a second (or this, if "
        "longer), each pass one database read",
    )
    stop_grace_s: float = Field(
        default=10.0,
        ge=0,
        le=600,
        description="seconds between SIGTERM and SIGKILL when a job is cancelled or stopped",
    )
    preempt_min_run_s: float = Field(
        default=120.0, ge=0, le=86400,
        description="a job preempted once runs at least this long after each start before "
        "it may be preempted again (no thrashing; docs/lifecycle.md)",
    )
    usage_half_life_h: float = Field(
        default=168.0, gt=0, le=8760, allow_inf_nan=False,
        description="half-life of recent usage in the fair-share factor, in hours (default a "
        "week): a slot-hour used this long ago counts half (docs/scheduling.md)",
    )
    python_executable: str | None = Field(
        default=None,
        description="Python interpreter that runs torchrun and the ranks; unset = the server's "
        "own",
    )
    stack_sampler: str = Field(
        default="auto",
        max_length=4096,
        description="program that dumps a rank's Python stacks (py-spy) at a heartbeat timeout "
        "and for GET /jobs/{id}/stacks: 'auto' = py-spy next to the server's Python, else on "
        "PATH; 'off' = never; else a path or command name (docs/lifecycle.md)",
    )
    stacks_per_job: int = Field(
        default=2, ge=1, le=64,
        description="GET /jobs/{id}/stacks calls (taken now) waiting at once for one job, per "
        "server process; more are 429 with Retry-After (docs/security.md)",
    )
    stacks_in_flight: int = Field(
        default=4, ge=1, le=256,
        description="GET /jobs/{id}/stacks calls (taken now) waiting at once for all jobs, per "
        "server process; more are 429 with Retry-After (docs/security.md)",
    )
    executor: Literal["local", "slurm"] = Field(
        default="local",
        description="what runs jobs: 'local' = a torchrun process group per job on this host; "
        "'slurm' = a batch job per job on a Slurm cluster (docs/slurm.md)",
    )
    warm_ranks: bool = Field(
        default=True,
        description="local executor: start ranks (and torchrun's agent) from a per-host warm "
        "server that has imported torch already, so a job's code runs within a fraction of a "
        "second; a job starts cold when the pool is not ready. On by default; it costs the "
        "pool's memory (about 0.5 GB with the default preload) and a few CPU seconds when the "
        "server starts; false turns it off (docs/warm-ranks.md)",
    )
    warm_pool_size: int | None = Field(
        default=None,
        ge=0,
        le=64,
        description="warm processes kept forked and idle (one per rank plus one per torchrun "
        "agent; more are forked on demand, refilled in the background); unset = one more than "
        "the CPU slots, at most 8 (the largest job this host runs, and its agent)",
    )
    warm_dir: Path | None = Field(
        default=None,
        description="directory of the warm server's socket, lock and log; unset = HOME/warm. "
        "Servers of one user naming the same directory share one warm server (one pool's "
        "memory and torch import, not one per server); it drains once all of them stopped. "
        "Created 0700 if missing (its parent must exist); one that is not this user's private "
        "directory leaves warm ranks off, saying why (docs/warm-ranks.md)",
    )
    warm_max_memory_mib: int = Field(
        default=4096,
        ge=0,
        le=1_048_576,
        description="memory budget of the warm pool (RSS of the warm server plus the pages "
        "its idle processes do not share with it, MiB); over it the server is replaced once "
        "its running ranks end; 0 = none",
    )
    warm_preload: Annotated[list[str], NoDecode] = Field(
        default=[
            "torch", "torch.distributed", "torch.nn.parallel",
            "torch.distributed.elastic.multiprocessing.errors", "torch.distributed.launcher.api",
            # Imported lazily, but by every DDP job: DistributedDataParallel's constructor
            # reads a torch._dynamo setting (~1 CPU s of imports per rank).
            "torch._dynamo", "worker.train",
        ],
        description="modules the warm server imports, comma-separated (ranks get them "
        "already imported: a job's own copy of one of them on its path is not used); the "
        "default is what every DDP job needs (torch, its distributed package, torchrun's agent, "
        "torch._dynamo, which DistributedDataParallel imports) and the built-in trainer; a job "
        "importing more (torchvision, scikit-learn) imports it then",
    )
    lease_ttl_s: float = Field(
        default=6.0,
        ge=2,
        le=300,
        description="seconds the supervisor lease lasts unrenewed: a standby server on the same "
        "database takes over at most this plus a sixth of it after the leader stops renewing "
        "(docs/operations.md)",
    )
    db_lock_timeout_s: float = Field(
        default=5.0,
        ge=0.1,
        le=300,
        description="longest a request waits for a database lock another process holds (SQLite: "
        "the write lock; PostgreSQL: lock_timeout on a row or a job's record lock) before it "
        "is answered 503 with Retry-After; PostgreSQL ends a write transaction left idle 3 "
        "times this long; the supervisor's own writes wait at most 1 s and retry on its next "
        "pass (docs/operations.md)",
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
    allowed_hosts: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="host names clients may reach the server by (the Host header) besides IP "
        "addresses, localhost, HOST and the host of PUBLIC_URL, comma-separated; checked only "
        "without API tokens (a DNS-rebinding guard)",
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
        description="seconds a job's token is still recognised after the job ended (its "
        "records are then answered 409: nothing is stored after the end)",
    )
    spool_ingest_max_records: int = Field(
        default=100_000,
        ge=0,
        le=100_000_000,
        description="most records read back from one rank's spool file when a job ends (only "
        "what the API did not acknowledge is read); the rest stays in the file and the job's "
        "reason says so",
    )

    _split_lists = field_validator(
        "api_tokens", "allowed_hosts", "cors_origins", "data_dirs", "warm_preload", mode="before"
    )(_comma_list)

    @field_validator("api_tokens")
    @classmethod
    def _hash_at_once(cls, tokens: list[str]) -> list[str]:
        """Only SHA-256 digests stay in memory; a short (guessable) token is refused."""
        if any(len(t) < API_TOKEN_MIN_CHARS for t in tokens):
            raise ValueError(f"every API token needs at least {API_TOKEN_MIN_CHARS} characters")
        return [hash_token(t) for t in tokens]

    @property
    def api_tokens_configured(self) -> bool:
        """Sign-in is on when either source of API tokens is set (an unreadable or empty file
        fails closed) or JWTs of an identity provider are accepted. (Personal tokens in the
        database close the API too, but are not a setting: ``service.api.middleware.auth``.)"""
        return bool(self.api_tokens) or self.api_tokens_file is not None or self.jwt_enabled

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
                raise ValueError(
                    f"api_tokens_file: cannot read {self.api_tokens_file}: {exc}"
                ) from exc
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
    def packages_dir(self) -> Path:
        return self.home / "packages"

    @property
    def runs_dir(self) -> Path:
        return self.home / "runs"

    @property
    def resolved_database_url(self) -> str:
        if self.database_url:
            return self.database_url
        return f"sqlite:///{(self.home / 'torchyard.db').resolve()}"

    def api_url_for_ranks(self, bound_port: int | None = None) -> str:
        """``PUBLIC_URL``, else ``http://HOST:PORT``: an IPv6 address in brackets (as URLs need
        it), a wildcard address as 127.0.0.1."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = "127.0.0.1" if self.host in ("0.0.0.0", "::", "") else self.host
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{bound_port or self.port}"

    def server_host_names(self) -> list[str]:
        """Names this server answers to besides IP addresses and localhost (``BrowserGuard``)."""
        names = [self.host, *self.allowed_hosts]
        if self.public_url:
            names.append(urlsplit(self.public_url).hostname or "")
        return [n for n in names if n]
