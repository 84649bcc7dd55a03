"""Service settings, read once from the environment (prefix ``TORCHYARD_``) and injected."""

import os
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.domain.jobtoken import hash_token
from service.domain.webhookconf import read_endpoints
from torchyard_contract.spec_types import SLURM_CONSTRAINT_PATTERN, SLURM_NAME_PATTERN

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
    stack_sampler: str = Field(
        default="auto",
        max_length=4096,
        description="program that dumps a rank's Python stacks (py-spy) at a heartbeat timeout "
        "and for GET /jobs/{id}/stacks: 'auto' = py-spy next to the server's Python, else on "
        "PATH; 'off' = never; else a path or command name (docs/lifecycle.md)",
    )
    executor: Literal["local", "slurm"] = Field(
        default="local",
        description="what runs jobs: 'local' = a torchrun process group per job on this host; "
        "'slurm' = a batch job per job on a Slurm cluster (docs/slurm.md)",
    )
    warm_ranks: bool = Field(
        default=False,
        description="local executor: start ranks (and torchrun's agent) from a per-host warm "
        "server that has imported torch already, so a job's code runs within a fraction of a "
        "second; a job starts cold when the pool is not ready (docs/warm-ranks.md)",
    )
    warm_pool_size: int = Field(
        default=4,
        ge=0,
        le=64,
        description="warm processes kept forked and idle (one per rank plus one per torchrun "
        "agent; more are forked on demand, refilled in the background)",
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
            "torchvision", "worker.train", "sklearn.datasets",
        ],
        description="modules the warm server imports, comma-separated (ranks get them "
        "already imported: a job's own copy of one of them on its path is not used)",
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
    test_record_pause_s: float = Field(
        default=0.0,
        ge=0,
        le=600,
        description="tests only: seconds a record batch holding a metric named `test_pause` "
        "waits inside its write transaction (holding SQLite's write lock, or the job's record "
        "lock on PostgreSQL), so a test can freeze the process there; 0 = never",
    )
    test_launch_pause_s: float = Field(
        default=0.0,
        ge=0,
        le=600,
        description="tests only: seconds the supervisor pauses after starting a job's shim and "
        "before storing its reference, so a test can kill the server inside that window; 0 = "
        "never",
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
    # --- packages, retention, disk (docs/packages.md) -----------------------------------------
    packages_enabled: bool = Field(
        default=True,
        description="accept code uploads (POST /packages) and jobs that name a package; they "
        "need API tokens too; false = 403 for both",
    )
    package_max_upload_bytes: int = Field(
        default=1024**3, ge=1024, le=1024**4,
        description="largest archive POST /packages accepts (413 beyond it, while it streams)",
    )
    package_max_files: int = Field(
        default=20_000, ge=1, le=10_000_000,
        description="most members (files and directories) an uploaded archive may hold",
    )
    package_max_unpacked_bytes: int = Field(
        default=4 * 1024**3, ge=1024, le=1024**4,
        description="most bytes an uploaded archive may unpack to, counted as it inflates",
    )
    package_grace_s: float = Field(
        default=86400.0, ge=0, le=365 * 86400,
        description="a package no queued or running job names is removed once it has not been "
        "uploaded, checked (HEAD) or used for this long",
    )
    retention_days: float | None = Field(
        default=None, gt=0, le=36500,
        description="terminal jobs that ended longer ago than this are deleted in the "
        "background (records, logs, run directory, outputs); unset = kept forever",
    )
    retention_sweep_s: float = Field(
        default=300.0, ge=0.1, le=86400,
        description="seconds between the supervisor's clean-up passes (retention, unused "
        "packages, run directories left without a job)",
    )
    disk_free_floor_bytes: int = Field(
        default=256 * 1024**2, ge=0, le=1024**5,
        description="below this much free space under HOME, new jobs and uploads are refused "
        "with 507 (running jobs carry on); 0 = no floor",
    )

    # --- Slurm executor (docs/slurm.md) ---------------------------------------------------------
    slurm_partition: str | None = Field(
        default=None,
        pattern=SLURM_NAME_PATTERN,
        description="slurm executor: partition of jobs that name none; unset = the cluster's "
        "default partition",
    )
    slurm_account: str | None = Field(
        default=None, pattern=SLURM_NAME_PATTERN,
        description="slurm executor: account of jobs that name none; unset = the user's default",
    )
    slurm_qos: str | None = Field(
        default=None, pattern=SLURM_NAME_PATTERN,
        description="slurm executor: QOS of jobs that name none; unset = the default",
    )
    slurm_constraint: str | None = Field(
        default=None, pattern=SLURM_CONSTRAINT_PATTERN,
        description="slurm executor: node features of jobs that name none (--constraint)",
    )
    slurm_bin_dir: Path | None = Field(
        default=None,
        description="slurm executor: directory of sbatch, squeue, scontrol, scancel, sinfo and "
        "sacct; unset = found on the server's PATH, once, at start (absolute paths from then on)",
    )
    slurm_command_timeout_s: float = Field(
        default=30.0,
        gt=0,
        le=600,
        allow_inf_nan=False,
        description="slurm executor: a Slurm command (sbatch, squeue, …) that has not answered "
        "after this long is killed; an sbatch that timed out is looked up by its job's name and "
        "adopted, or its job fails saying so",
    )
    slurm_shared_runs: bool = Field(
        default=False,
        description="slurm executor: HOME/runs is on a filesystem every node mounts at the same "
        "path, though its type is not one torchyard recognises as shared (NFS, Lustre, GPFS, "
        "BeeGFS, CephFS, …); the server refuses to start otherwise",
    )

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
    # --- webhooks (docs/webhooks.md) ------------------------------------------------------------
    webhooks_file: Path | None = Field(
        default=None,
        description="JSON object of endpoint name → {url, secret 'whsec_<base64>', events?, "
        "all_jobs?, format?} that jobs name in notify; read at each submit and delivery round; "
        "unset = no webhooks (docs/webhooks.md)",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=300, allow_inf_nan=False,
        description="a receiver that has not answered a delivery after this long is timed out "
        "(the delivery is retried)",
    )
    webhook_concurrency: int = Field(
        default=8, ge=1, le=256,
        description="deliveries the supervisor sends at once (its own threads; never the loop's)",
    )
    webhook_retry_first_s: float = Field(
        default=5.0, gt=0, le=3600, allow_inf_nan=False,
        description="wait before a failed delivery's first retry; each later wait doubles",
    )
    webhook_retry_max_interval_s: float = Field(
        default=3600.0, gt=0, le=86400, allow_inf_nan=False,
        description="longest wait between two tries of one delivery",
    )
    webhook_retry_for_s: float = Field(
        default=24 * 3600.0, gt=0, le=30 * 86400, allow_inf_nan=False,
        description="a delivery still failing this long after its event is given up (failed)",
    )

    @field_validator("webhooks_file")
    @classmethod
    def _webhooks_file_reads(cls, value: Path | None) -> Path | None:
        if value is not None:
            read_endpoints(value)  # raises WebhookConfigError (a ValueError) naming the problem
        return value

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

    def api_url_for_workers(self, bound_port: int | None = None) -> str:
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
