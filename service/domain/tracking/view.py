"""What ``GET /jobs/{id}`` says of a job's MLflow export: its run and where the export stands."""

from dataclasses import dataclass

from sqlalchemy.orm import Session

from service.store import tracking as store


@dataclass(frozen=True)
class ExportView:
    run_id: str | None
    experiment: str | None
    # "pending N" (N records not in MLflow yet; "pending 0": the run is to be made or closed),
    # "exported" (every record stored so far is in the run, and its status follows the job),
    # or "error: …" (the last try failed; it is retried).
    state: str


def mlflow_export(session: Session, job_id: int) -> ExportView | None:
    """None when the job is not exported to MLflow."""
    row = store.export_of_job(session, job_id)
    if row is None or not row.mlflow:
        return None
    if row.error:
        state = f"error: {row.error}"
    elif row.mlflow_done:
        state = "exported"
    else:
        pending = store.records_after_count(session, job_id, row.acked_seq)
        job = store.job(session, job_id)
        caught_up = (row.run_id is not None and pending == 0 and job is not None
                     and job.ended_at is None)
        state = "exported" if caught_up else f"pending {pending}"
    return ExportView(row.run_id, row.experiment, state)
