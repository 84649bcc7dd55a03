"""Launching a job: what its ranks get (a pure builder) and handing it to the executor.

:func:`launch_config` and :func:`rank_env` are pure: given the settings, the spec, the job's
token and its placement they build the launch configuration (``torchyard_contract.launch``) and
the rank environment (``torchyard_contract.envnames``), so a dry run can print them. They are the
one place that chooses a rank's device and backend from its placement (``service.domain.queue.placement``).
:class:`RunStarter` writes the run directory and submits: the only code that starts a job.
"""

import json
import logging
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.orm import Session

from service.domain.files.packages import PackageMissing, package_store
from service.domain.files.runowner import prepare_run_dir
from service.domain.identity.runas import RunAsRefused, resolve_run_as
from service.domain.intake import secretstore
from service.domain.intake.scriptpath import RankProgram, ScriptRefused, rank_program
from service.domain.intake.secretstore import SecretRefused
from service.domain.loop.context import LoopContext
from service.domain.queue.placement import Placement
from service.executor.base import ExecutorError, Submission
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import identity as identitystore
from service.store import repository as repo
from service.store.tables import Job
from torchyard_contract import envnames as names
from torchyard_contract import runwrite
from torchyard_contract.launch import LaunchConfig, RunAs
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import Backend, Device, JobSpec
from torchyard_contract.state import JobState

logger = logging.getLogger(__name__)


def launch_config(
    settings: Settings, job_id: int, spec: JobSpec, program: RankProgram,
    run_as: RunAs | None = None,
) -> LaunchConfig:
    """What the attempt loop reads from ``launch.json``: the rank program and its limits, and
    the Unix user it runs as (``run_as``; None = the server's)."""
    return LaunchConfig(
        job_id=job_id,
        python=settings.python_executable or sys.executable,
        nproc_per_node=spec.nproc_per_node,
        max_restarts=spec.max_restarts,
        max_runtime_s=spec.max_runtime_s,
        heartbeat_timeout_s=spec.heartbeat_timeout_s,
        stop_grace_s=settings.stop_grace_s,
        program=list(program.argv),
        pythonpath=program.pythonpath,
        nnodes=spec.nnodes,
        workdir=program.workdir,
        on_failure=[r.model_dump(exclude_none=True) for r in spec.on_failure] or None,
        restart_backoff_s=spec.restart_backoff_s,
        stack_sampler=stack_sampler(settings),
        pause_grace_s=spec.pause_grace_s,
        run_as=run_as,
    )


def stack_sampler(settings: Settings) -> str | None:
    """``TORCHYARD_STACK_SAMPLER`` resolved: 'auto' = py-spy beside this Python, else on PATH."""
    if settings.stack_sampler == "off":
        return None
    if settings.stack_sampler != "auto":
        return settings.stack_sampler
    for python in (sys.executable, settings.python_executable):
        if python and (beside := Path(python).parent / "py-spy").is_file():
            return str(beside)
    return "py-spy"


# NCCL's Flight Recorder (ignored on gloo): each rank's last collectives, dumped on a timeout
# into the run directory (RunDir.flight_recorder_prefix); the attempt loop keeps them with the attempt.
FLIGHT_RECORDER_BUFFER = "2000"


def flight_recorder_env(run: RunDir) -> dict[str, str]:
    """Only TORCH_NCCL_* names (torch reads TORCH_FR_* as their aliases): torch reads them when
    a process group is made, so warm ranks may take them (``service.run.warm.server``); a
    TORCH_FR_* variable would send every job to a cold start."""
    return {
        "TORCH_NCCL_TRACE_BUFFER_SIZE": FLIGHT_RECORDER_BUFFER,
        "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
        "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": str(run.flight_recorder_prefix),
    }


def rank_env(
    *, job_id: int, token: str, run: RunDir, spec: JobSpec, api_url: str, cpu_slots: int,
    secrets: dict[str, str], resume_dir: str | None, placement: Placement | None,
    params: dict | None = None,
) -> dict[str, str]:
    """Every rank's environment. ``placement`` None: the executor places the job (Slurm sets
    CUDA_VISIBLE_DEVICES itself); the device and backend are then set only where the spec names
    them, and each rank picks the rest (``worker.distributed``)."""
    env = {
        **flight_recorder_env(run),  # a script's own env may set these otherwise
        **spec.env,  # a script job's own variables; never torchyard's (JobSpec refuses them)
        **secrets,  # only ever in a process environment (see service.domain.intake.secretstore)
        names.API_URL: api_url,
        names.JOB_ID: str(job_id),
        names.JOB_TOKEN: token,
        names.RUN_DIR: str(run.root),
        names.OUTPUT_DIR: str(run.output_dir),
        names.ERROR_FILE: str(run.error_file),
        "PYTHONUNBUFFERED": "1",
    }
    if resume_dir is not None:
        env[names.RESUME_DIR] = resume_dir
    if params is not None:  # a sweep's trial: its parameters, for worker.params()
        env[names.PARAMS] = json.dumps(params, sort_keys=True)
    if placement is None:
        if spec.device is not Device.auto:
            env[names.DEVICE] = spec.device.value
        if spec.backend is not Backend.auto:
            env[names.BACKEND] = spec.backend.value
        elif spec.device is Device.cpu:
            env[names.BACKEND] = Backend.gloo.value
        if spec.device is Device.cpu:
            env["OMP_NUM_THREADS"] = "1"  # one CPU per rank (--cpus-per-task=nproc_per_node)
        return env
    # CPU jobs: one thread per slot held; GPU jobs: share the host's cores among the ranks.
    threads = 1 if placement.device == "cpu" else max(1, cpu_slots // spec.nproc_per_node)
    env.update({
        names.DEVICE: placement.device,
        names.BACKEND: placement.backend,
        "OMP_NUM_THREADS": str(threads),
        "CUDA_VISIBLE_DEVICES": ",".join(str(i) for i in placement.gpu_indices),
    })
    return env


@dataclass
class RunStarter:
    ctx: LoopContext

    def _team_launch(self, team: str | None) -> tuple[RunAs | None, str | None, str | None]:
        """(run as, Slurm account, Slurm QOS) of ``team``'s jobs. Run as: the team's
        ``unix_user`` when this server runs as root (``service.domain.identity.runas``), else
        None (the server's own user); raises ``RunAsRefused`` for a ``unix_user`` gone from the
        host since it was set: the job fails, naming it, rather than run as the server."""
        if team is None:
            return None, None, None
        with self.ctx.read_sessions() as session:
            row = identitystore.get_team(session, team)
        if row is None:
            return resolve_run_as(None, os.getuid()), None, None
        return resolve_run_as(row.unix_user, os.getuid()), row.slurm_account, row.slurm_qos

    def start_team_run(
        self, job_id: int, token: str, spec: JobSpec, placement: Placement | None,
        params: dict | None = None, exclude_nodes: Sequence[str] = (), team: str | None = None,
    ) -> str:
        """:meth:`start_run` as ``team``'s Unix user (:meth:`_team_launch`), with its secrets,
        charged to its Slurm account and QOS."""
        run_as, account, qos = self._team_launch(team)
        return self.start_run(job_id, token, spec, placement, params, exclude_nodes, team,
                              run_as=run_as, account=account, qos=qos)

    def start_run(
        self, job_id: int, token: str, spec: JobSpec, placement: Placement | None,
        params: dict | None = None, exclude_nodes: Sequence[str] = (), team: str | None = None,
        run_as: RunAs | None = None, account: str | None = None, qos: str | None = None,
    ) -> str:
        """Write the run directory and submit the job's attempt loop; its reference, or raises
        (``ScriptRefused``: the script went away or out of bounds since submit;
        ``PackageMissing``; ``SecretRefused``; ``OSError``; the executor's errors).
        ``exclude_nodes``: the job's ``exclude_nodes`` (retry_elsewhere; Slurm only); ``team``:
        the job's, whose secrets it may use. ``run_as``: the Unix user every process of the job
        runs as, who then owns its run directory (``service.domain.files.runowner``); None =
        this server's user. ``account``, ``qos``: the team's Slurm account and QOS, used where
        the spec names none."""
        settings = self.ctx.settings
        run = RunDir.for_job(settings.runs_dir, job_id)
        prepare_run_dir(run, run_as)
        runwrite.write_file(run.spec_file, spec.model_dump_json(indent=2).encode())
        runwrite.make_dir(run.output_dir)
        runwrite.make_dir(run.flight_recorder_prefix.parent)
        package_root = None
        if spec.package is not None:  # the job's own copy: its writes reach no other job
            package_store(settings).copy_for_job(spec.package, run.work_dir)
            package_root = run.work_dir
        program = rank_program(spec, settings.script_dir_list, run.spec_file, package_root)
        launch_config(settings, job_id, spec, program, run_as).write(run)
        resume_dir = None
        if spec.resume_from is not None:
            resume_dir = str(RunDir.for_job(settings.runs_dir, spec.resume_from).checkpoints_dir)
        env = rank_env(
            job_id=job_id, token=token, run=run, spec=spec, api_url=self.ctx.api_url,
            cpu_slots=self.ctx.inventory.cpu_slots,
            secrets=secretstore.resolve(spec.secret_env, settings.secrets_file, team),
            resume_dir=resume_dir, placement=placement, params=params,
        )
        return self.ctx.executor.submit(Submission(
            job_id=job_id, run=run, env=env, nproc_per_node=spec.nproc_per_node,
            nnodes=spec.nnodes, exclude_nodes=tuple(str(n) for n in exclude_nodes),
            run_as=run_as, account=account, qos=qos,
        ))

    def launch(self, session: Session, job: Job, spec: JobSpec, placement: Placement) -> None:
        """queued → starting (compare-and-set, under the lease's fence) with its resources
        booked, then start it; a launch that fails leaves the job failed with its resources
        freed, never starting."""
        ctx = self.ctx
        token, token_hash = new_token()
        if not ctx.lease.fence(session) or not repo.transition(
            session, job.id, JobState.starting,
            started_at=repo.utcnow(), devices=",".join(placement.resources), token_hash=token_hash,
            preempted_by=None, reason=None,  # a resumed job's pause is over
        ):
            session.rollback()
            return
        repo.allocate(session, job.id, placement.resources)
        session.commit()
        try:
            ref = self.start_team_run(job.id, token, spec, placement, job.params, team=job.team)
        except Exception as exc:  # whatever failed, the job must not stay starting, holding slots
            if not isinstance(exc, ScriptRefused | SecretRefused | OSError | PackageMissing
                              | RunAsRefused | ExecutorError):
                logger.exception("job %s: launch failed", job.id)
            if ctx.lease.fence(session):  # else the next supervisor gives the launch up
                repo.transition(session, job.id, JobState.failed, reason=f"could not start: {exc}")
                repo.release(session, job.id)
            session.commit()
            ctx.queue_changed()
            return
        ctx.watched.refs[job.id] = ref
        if not ctx.lease.fence(session):
            # The next supervisor adopts the attempt loop from its claim (torchyard_contract.claim).
            session.rollback()
            logger.warning("job %s: lease lost while launching; left to the next supervisor", job.id)
            return
        repo.set_executor_ref(session, job.id, ctx.executor.name, ref)
        session.commit()
        logger.info("job %s: launched (%s %s) on %s", job.id, ctx.executor.name, ref,
                    placement.resources)
