"""Settings of the optional parts (Slurm, packages and clean-up, webhooks, tracking), one class each;
:class:`service.settings.Settings` combines them, so every field is still read once from
``TORCHYARD_*`` and injected as one object."""

from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, SecretStr, field_validator

from service.settings.webhookfile import read_endpoints
from torchyard_contract.spec_types import SLURM_CONSTRAINT_PATTERN, SLURM_NAME_PATTERN


class SlurmSettings(BaseModel):
    """The Slurm executor (docs/slurm.md)."""

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


class PackageSettings(BaseModel):
    """Packages, retention and the disk floor (docs/packages.md)."""

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
        default=512 * 1024**2, ge=1024, le=1024**4,
        description="most bytes an uploaded archive may unpack to, counted as it inflates "
        "(every job copies the whole tree into its run directory)",
    )
    package_max_depth: int = Field(
        default=64, ge=1, le=512,
        description="most levels (path components) a member's name in an uploaded archive "
        "may have; a component may be 255 bytes, a name 1024",
    )
    package_max_ratio: int = Field(
        default=200, ge=1, le=1_000_000,
        description="most times an uploaded archive may inflate its compressed bytes, per zip "
        "member and per archive, counted as it inflates (the first MiB of each is free)",
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


class WebhookSettings(BaseModel):
    """Webhooks (docs/webhooks.md)."""

    webhooks_file: Path | None = Field(
        default=None,
        description="JSON object of endpoint name → {url, secret 'whsec_<base64>', events?, "
        "all_jobs?, format?} that jobs name in notify; read at each submit and delivery round; "
        "unset = no webhooks (docs/webhooks.md)",
    )
    webhook_timeout_s: float = Field(
        default=10.0, gt=0, le=300, allow_inf_nan=False,
        description="one deadline per delivery try: connecting, sending and the receiver's "
        "whole answer (status and headers) together; past it the try fails and is retried",
    )
    webhook_concurrency: int = Field(
        default=8, ge=1, le=256,
        description="deliveries the supervisor sends at once (its own threads; never the loop's)",
    )
    webhook_endpoint_concurrency: int = Field(
        default=2, ge=1, le=256,
        description="deliveries to one endpoint in flight at once: a slow endpoint holds at most "
        "this many of the webhook_concurrency senders, each until the try's deadline",
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


class TrackingSettings(BaseModel):
    """Exports of every job's metrics to MLflow and TensorBoard (docs/tracking.md)."""

    mlflow_tracking_uri: str | None = Field(
        default=None, max_length=2048,
        description="http(s):// URL of an MLflow tracking server: every job becomes an MLflow "
        "run (unless its spec says mlflow: false), exported by the supervisor from the stored "
        "records; unset = no MLflow export (docs/tracking.md)",
    )
    mlflow_token: SecretStr | None = Field(
        default=None, max_length=4096,
        description="bearer token sent to the MLflow tracking server (Authorization header); a "
        "server secret: never logged, shown or passed to jobs",
    )
    mlflow_max_artifact_bytes: int = Field(
        default=1024**3, ge=0, le=1024**4,
        description="most bytes of a job's output directory uploaded to its MLflow run when its "
        "spec says mlflow.log_outputs; files past it are skipped and a tag says which",
    )
    tensorboard: bool = Field(
        default=True,
        description="write every job's scalars as TensorBoard event files under its run "
        "directory (RUN_DIR/tensorboard, served as GET /jobs/{id}/artifacts/tensorboard/...) "
        "while it runs; false turns it off (docs/tracking.md)",
    )

    @field_validator("mlflow_tracking_uri")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is None or not value.strip():
            return None
        parts = urlsplit(value.strip())
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("TORCHYARD_MLFLOW_TRACKING_URI: an http:// or https:// URL of an "
                             "MLflow tracking server")
        return value.strip().rstrip("/")
