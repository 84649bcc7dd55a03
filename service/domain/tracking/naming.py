"""What a job or a sweep is called in MLflow: experiment, run name, tags, params and status.

Pure functions of the stored job (or sweep) and the settings; no I/O. The owner and the team are
read from the row when it has them (``owner`` and ``team`` columns, when teams exist), so this
module works with and without them.
"""

from typing import Any

from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState
from torchyard_contract.tracking import MlflowOptions, mlflow_options

DEFAULT_EXPERIMENT = "torchyard"
# MLflow's own limits (3.x): a param's value, a tag's value.
PARAM_VALUE_MAX = 6000
TAG_VALUE_MAX = 8000
# The spec fields logged as params of a built-in trainer's run.
TRAINER_PARAMS = ("model", "dataset", "epochs", "batch_size", "lr", "optimizer", "momentum",
                  "weight_decay", "seed")
# MLflow's run statuses.
RUNNING, SCHEDULED, FINISHED, FAILED, KILLED = (
    "RUNNING", "SCHEDULED", "FINISHED", "FAILED", "KILLED")
TERMINAL_STATUS = {JobState.succeeded.value: FINISHED, JobState.failed.value: FAILED,
                   JobState.cancelled.value: KILLED}
SWEEP_STATUS = {"succeeded": FINISHED, "failed": FAILED, "cancelled": KILLED}


def team_of(row: Any) -> str | None:
    """The row's team, when the store has teams and the row one; else None."""
    team = getattr(row, "team", None)
    return team if isinstance(team, str) and team else None


def owner_of(row: Any) -> str | None:
    owner = getattr(row, "owner", None)
    return owner if isinstance(owner, str) and owner else None


def experiment_for(row: Any, options: MlflowOptions | None) -> str:
    """The experiment of a job (or sweep) row: the spec's ``mlflow.experiment``, else the row's
    team when teams exist and it has one, else ``torchyard``."""
    if options is not None and options.experiment:
        return options.experiment
    return team_of(row) or DEFAULT_EXPERIMENT


def options_of(spec: JobSpec) -> MlflowOptions | None:
    """The spec's MLflow options; None when it says ``"mlflow": false``."""
    return mlflow_options(spec.mlflow)


def job_status(state: str, ever_ran: bool) -> str:
    """MLflow's status for a job: SCHEDULED until it first runs, RUNNING while it is not over
    (paused and resumed jobs included), then FINISHED, FAILED or KILLED."""
    if state in TERMINAL_STATUS:
        return TERMINAL_STATUS[state]
    return RUNNING if ever_ran else SCHEDULED


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def job_url(public_url: str | None, job_id: int) -> str | None:
    """The job's page on the dashboard, from ``TORCHYARD_PUBLIC_URL``; None without it."""
    return f"{public_url.rstrip('/')}/#/jobs/{job_id}" if public_url else None


def job_tags(job: Any, spec: JobSpec, public_url: str | None, export_key: str,
             parent_run_id: str | None) -> dict[str, str]:
    """Tags set when a job's run is created."""
    tags = {
        "torchyard.job_id": str(job.id),
        "torchyard.export_key": export_key,
        "mlflow.source.name": spec.entrypoint or f"torchyard built-in {spec.model.value}",
        "mlflow.source.type": "JOB",
    }
    url = job_url(public_url, job.id)
    if url:
        tags["torchyard.url"] = url
    if owner_of(job):
        tags["torchyard.owner"] = owner_of(job)  # type: ignore[assignment]
        tags["mlflow.user"] = owner_of(job)  # type: ignore[assignment]
    if team_of(job):
        tags["torchyard.team"] = team_of(job)  # type: ignore[assignment]
    if job.sweep_id is not None:
        tags["torchyard.sweep_id"] = str(job.sweep_id)
    if parent_run_id:
        tags["mlflow.parentRunId"] = parent_run_id
    return {k: _cut(v, TAG_VALUE_MAX) for k, v in tags.items()}


def job_params(job: Any, spec: JobSpec) -> dict[str, str]:
    """The spec's training fields: a built-in trainer's hyperparameters or a script's ``args``
    (joined by spaces), the ranks (``nproc_per_node``, ``nnodes``), and a trial's sweep
    parameters (under their own names)."""
    params: dict[str, str] = {}
    if spec.is_script:
        if spec.args:
            params["args"] = " ".join(spec.args)
    else:
        for name in TRAINER_PARAMS:
            value = getattr(spec, name)
            params[name] = str(getattr(value, "value", value))
    params["nproc_per_node"] = str(spec.nproc_per_node)
    params["nnodes"] = str(spec.nnodes)
    for name, value in (job.params or {}).items():
        params[str(name)] = str(value)
    return {k: _cut(v, PARAM_VALUE_MAX) for k, v in params.items()}


def sweep_tags(sweep: Any, export_key: str) -> dict[str, str]:
    return {"torchyard.sweep_id": str(sweep.id), "torchyard.export_key": export_key,
            "mlflow.source.name": "torchyard sweep", "mlflow.source.type": "JOB"}


def sweep_params(spec: dict) -> dict[str, str]:
    """The search as params: method, objective, trials, parallel and the space's keys."""
    objective = spec.get("objective") or {}
    params = {
        "sweep.method": str(spec.get("method", "")),
        "sweep.objective": f"{objective.get('mode', '')} {objective.get('metric', '')}".strip(),
        "sweep.parallel": str(spec.get("parallel", "")),
        "sweep.space": ", ".join(sorted((spec.get("space") or {}).keys())),
    }
    return {k: _cut(v, PARAM_VALUE_MAX) for k, v in params.items() if v}
