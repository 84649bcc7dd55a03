"""Which jobs and sweeps are exported, decided when they are created: an outbox row written in
the transaction that stores the job (``service.domain.intake.submission``, a sweep's trial in
``service.domain.sweeps.driver``) or the sweep (``service.domain.sweeps.manage``).

A job is exported to MLflow when the server has a tracking server
(``TORCHYARD_MLFLOW_TRACKING_URI``) and its spec does not say ``"mlflow": false``; its
TensorBoard files are written when ``TORCHYARD_TENSORBOARD`` is on (the default). A job submitted
while neither was on has no row and is never exported.
"""

from typing import Any

from sqlalchemy.orm import Session

from service.domain.tracking import naming
from service.settings import Settings
from service.store import tracking as store
from torchyard_contract.spec import JobSpec


def refusal(spec: JobSpec, settings: Settings) -> str | None:
    """Why this server cannot take the spec's ``mlflow`` (a 422), or None."""
    if spec.mlflow not in (None, False) and not settings.mlflow_tracking_uri:
        return ("mlflow: this server exports to no MLflow tracking server "
                "(TORCHYARD_MLFLOW_TRACKING_URI is unset); leave mlflow out, or set it to false")
    return None


def enrol_job(session: Session, settings: Settings, job: Any, spec: JobSpec) -> None:
    """The job's outbox row, in the caller's transaction (after the job's insert)."""
    options = naming.options_of(spec)
    mlflow = bool(settings.mlflow_tracking_uri) and options is not None
    if not (mlflow or settings.tensorboard):
        return
    store.add_export(
        session, job_id=job.id, mlflow=mlflow, tensorboard=settings.tensorboard,
        experiment=naming.experiment_for(job, options) if mlflow else None,
        log_outputs=bool(mlflow and options is not None and options.log_outputs),
    )


def enrol_sweep(session: Session, settings: Settings, sweep: Any, base: JobSpec) -> None:
    """A sweep's outbox row (its parent run), when its trials will be exported to MLflow."""
    options = naming.options_of(base)
    if not settings.mlflow_tracking_uri or options is None:
        return
    store.add_export(session, sweep_id=sweep.id, mlflow=True, tensorboard=False,
                     experiment=naming.experiment_for(sweep, options))
