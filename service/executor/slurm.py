"""The Slurm executor: each torchyard job is one Slurm batch job named ``ty-<id>`` whose batch
script ``exec``s the job's attempt loop on the allocation's batch host
(``service.executor.slurmscript`` builds everything it runs; ``service.executor.slurmcli`` talks
to Slurm).

Reference: the Slurm job id. Phases: Slurm's PENDING (and requeue/hold states) is ``pending``
with Slurm's reason; a finished state, or a job Slurm no longer lists (purged after
``MinJobAge``), is ``ended`` — the job's outcome is its ``RUN_DIR/exit.json``, which the attempt
loop writes on the shared filesystem; Slurm's own verdict (``scontrol``, else ``sacct``) only
explains a job that left none. Anything else is ``running``. One ``squeue`` call answers every
job of a tick. When Slurm cannot be asked (``slurmctld`` down), every job keeps the phase it had.

Logs: ``RUN_DIR/logs/attempt-<n>/node-<k>/`` per node (torchrun's per-local-rank files below it,
the node's name in ``node``), ``node-<k>.log`` with each node's torchrun output.
"""

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from service.executor.base import DryRun, LogStreamName, Phase, RankLog, Status, Submission
from service.executor.slurmcli import (
    NodeRow,
    SlurmCli,
    SlurmError,
    SlurmTimeout,
    export_fd,
    parse_exit_code,
)
from service.executor.slurmpreflight import (
    PreflightError,
    all_nodes_here,
    check_public_url,
    check_shared_runs,
    mount_type,
    read_mounts,
    resolve_runs_dir,
    this_host_names,
)
from service.executor.slurmscript import (
    BatchRequest,
    build_batch_script,
    build_sbatch_command,
    export_file_content,
    job_environment,
    job_name,
    sbatch_environment,
)
from torchyard_contract import claim as runclaim
from torchyard_contract import runwrite
from torchyard_contract.confinement import resolves_inside
from torchyard_contract.launch import LAUNCH_FILE_MAX_BYTES
from torchyard_contract.nodes import rank_location, read_node_name
from torchyard_contract.rundir import RunDir
from torchyard_contract.safefile import is_regular, read_bytes
from torchyard_contract.spec import Device, JobSpec

logger = logging.getLogger(__name__)

NAME = "slurm"
SCRIPT_FILE = "job.sbatch"
CANCEL_WAIT_S = 120.0  # after scancel: Slurm's KillWait plus the time to reap every node
CANCEL_POLL_S = 0.2
SPEC_MAX_BYTES = 4 * 2**20  # spec.json as the server wrote it: far less
# What the server runs; sacct is optional (only where there is accounting or a completion log).
REQUIRED_PROGRAMS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo")


@dataclass(frozen=True)
class SlurmDefaults:
    """The server's choices for jobs whose spec names none (validated Slurm names)."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None


class SlurmExecutor:
    """Jobs as Slurm batch jobs. ``python``: the interpreter on the nodes (same path there);
    ``server_env``: the server's environment, of which ``sbatch`` keeps only ``KEPT_ENV``.
    Every Slurm command runs by the absolute path ``cli`` found at start, with a timeout."""

    name = NAME
    queues_jobs = True
    outcome_visible_within_s = 30.0
    excludes_nodes = True
    spans_nodes = True

    def __init__(
        self, cli: SlurmCli, python: str, server_env: Mapping[str, str], stop_grace_s: float,
        defaults: SlurmDefaults | None = None, shared_runs: bool = False,
    ) -> None:
        self.cli, self.python, self.server_env = cli, python, dict(server_env)
        self.stop_grace_s = stop_grace_s
        self.defaults = defaults or SlurmDefaults()
        self.shared_runs = shared_runs
        self._last: dict[str, Status] = {}  # reference → last status seen (Slurm unreachable)
        self._gpu_partitions: dict[str | None, bool] = {}
        self._lock = threading.Lock()

    def preflight(self, runs_dir: Path, api_url: str) -> None:
        """Refuse to start (``PreflightError``) when the nodes could not reach the API at
        ``api_url`` or could not see ``runs_dir``, or when a Slurm command it runs was not
        found; ``SlurmError`` when Slurm cannot be asked."""
        missing = [name for name in REQUIRED_PROGRAMS if name not in self.cli.programs]
        if missing:
            raise PreflightError(
                f"Slurm commands not found: {', '.join(missing)} (looked for on the server's "
                "PATH, or in TORCHYARD_SLURM_BIN_DIR when set)"
            )
        nodes = self.cli.sinfo(self.defaults.partition)
        if not nodes:
            raise PreflightError(
                f"Slurm lists no nodes in partition {self.defaults.partition or '(default)'}"
            )
        here = all_nodes_here((n.hostname for n in nodes), this_host_names())
        check_public_url(api_url, here)
        runs = resolve_runs_dir(runs_dir)
        check_shared_runs(runs, mount_type(runs, read_mounts()), here, self.shared_runs)

    def watch(self, wake: Callable[[], None]) -> None:
        """Slurm has no push channel worth its cost here; the supervisor's poll is the watch."""

    # --- submit -----------------------------------------------------------------------------
    def batch_request(self, sub: Submission) -> BatchRequest:
        """The allocation for ``sub``, from the spec in its run directory (written before
        ``submit``) and the server's defaults."""
        raw = read_bytes(sub.run.spec_file, SPEC_MAX_BYTES)  # confined: it may be the user's
        if raw is None:
            raise SlurmError(f"job {sub.job_id}: its spec.json cannot be read")
        spec = JobSpec.model_validate_json(raw)
        partition = spec.partition or self.defaults.partition
        return BatchRequest(
            job_id=sub.job_id,
            run_dir=sub.run.root,
            python=self.python,
            nnodes=sub.nnodes,
            nproc_per_node=sub.nproc_per_node,
            gpus_per_node=sub.nproc_per_node if self._wants_gpus(spec, partition) else 0,
            max_runtime_s=spec.max_runtime_s,
            stop_grace_s=self.stop_grace_s,
            partition=partition,
            account=spec.account or sub.account or self.defaults.account,
            qos=spec.qos or sub.qos or self.defaults.qos,
            constraint=spec.constraint or self.defaults.constraint,
            exclude=tuple(sub.exclude_nodes),
        )

    def _wants_gpus(self, spec: JobSpec, partition: str | None) -> bool:
        """``cuda`` → GPUs; ``cpu`` → CPUs; ``auto`` → GPUs when the partition's nodes have some."""
        if spec.device is not Device.auto:
            return spec.device is Device.cuda
        with self._lock:
            known = self._gpu_partitions.get(partition)
        if known is None:
            try:
                known = any(n.gpus for n in self.cli.sinfo(partition))
            except SlurmError:
                return False
            with self._lock:
                self._gpu_partitions[partition] = known
        return known

    def dry_run(self, sub: Submission) -> DryRun:
        script_path = sub.run.root / SCRIPT_FILE
        env = job_environment(self.server_env, sub.env, sub.run_as)
        return DryRun(
            argv=tuple(build_sbatch_command(self._sbatch_path(), script_path,
                                            run_as=sub.run_as)),
            cwd=sub.run.root,
            env_names=tuple(sorted(env)),
            script=build_batch_script(self.batch_request(sub)),
        )

    def _sbatch_path(self) -> str:
        return self.cli.programs.get("sbatch", "sbatch")

    def submit(self, sub: Submission) -> str:
        """``sbatch`` by its absolute path, with the environment ``sbatch_environment`` makes of
        the server's; the job's environment (``job_environment``: its token, its secrets, a
        script's ``env``) only in ``--export-file``, an anonymous in-memory file: never in
        sbatch's own environment, on its command line or in a file on disk. An ``sbatch`` that
        does not answer in time is killed and its job looked for (``_after_timeout``): adopted
        when Slurm has it, else given up."""
        plan = self.dry_run(sub)
        # Confined: the run directory may be the job's user's (torchyard_contract.runwrite).
        runwrite.write_file(Path(plan.argv[-1]), (plan.script or "").encode())
        sbatch_env = sbatch_environment(self.server_env)
        job_env = job_environment(self.server_env, sub.env, sub.run_as)
        with export_fd(export_file_content(job_env)) as fd:
            argv = build_sbatch_command(self.cli.program("sbatch"), Path(plan.argv[-1]), fd,
                                        sub.run_as)
            try:
                job_id = self.cli.sbatch(argv, env=sbatch_env, pass_fds=(fd,))
            except SlurmTimeout as exc:
                job_id = self._after_timeout(sub, exc)
            except SlurmError as exc:
                if not sub.exclude_nodes:
                    raise
                raise SlurmError(  # e.g. no node left once its failing nodes are excluded
                    f"{exc} (the job excludes node(s) {','.join(sub.exclude_nodes)}, where its "
                    "ranks failed before: retry_elsewhere)") from exc
        with self._lock:
            self._last[job_id] = Status(Phase.pending)
        logger.info("job %s: submitted as Slurm job %s", sub.job_id, job_id)
        return job_id

    def _after_timeout(self, sub: Submission, exc: SlurmTimeout) -> str:
        """An ``sbatch`` killed at its timeout may have submitted the job or not. Slurm is asked
        for a job of this name and run directory: one it has is adopted (any other copy is
        cancelled). With none, the launch is given up in the run directory
        (``torchyard_contract.claim``) before raising, so a submission that still lands exits at once
        without running anything; a job whose attempt loop claimed the run first is adopted."""
        name = job_name(sub.job_id)
        try:
            found = self.cli.find(name, str(sub.run.root))
        except SlurmError as lookup:
            found, asked = {}, f"Slurm could not be asked whether it has the job ({lookup})"
        else:
            asked = f"Slurm lists no job {name} of this run directory"
        if found:
            alive = [ref for ref, row in found.items() if not row.terminal]
            ref = max(alive or found, key=int)
            for other in sorted(set(alive) - {ref}, key=int):
                logger.warning("job %s: cancelling Slurm job %s, a second copy", sub.job_id, other)
                try:
                    self.cli.scancel(other)
                except SlurmError:
                    logger.exception("job %s: could not cancel Slurm job %s", sub.job_id, other)
            logger.warning("job %s: %s; Slurm has it as job %s: adopted", sub.job_id, exc, ref)
            return ref
        claim = runclaim.claim(sub.run, {runclaim.ABANDONED: f"sbatch timed out: {exc}"})
        if claim is not None and (ref := self.reference_from_claim(claim)) is not None:
            logger.warning("job %s: %s; its attempt loop runs as Slurm job %s: adopted",
                           sub.job_id, exc, ref)
            return ref
        raise SlurmError(
            f"{exc}; {asked}, so it is taken as not submitted (one that still arrives exits "
            "without running)"
        )

    # --- watch ------------------------------------------------------------------------------
    def describe(self, references: Mapping[int, str]) -> dict[int, Status]:
        refs = {job_id: ref for job_id, ref in references.items() if ref.isdigit()}
        try:
            rows = self.cli.squeue(refs.values())
        except SlurmError as exc:
            logger.warning("squeue failed (jobs keep their phase): %s", exc)
            with self._lock:
                return {
                    job_id: self._last.get(ref, Status(Phase.pending))
                    for job_id, ref in references.items()
                }
        answer: dict[int, Status] = {}
        for job_id, ref in references.items():
            row = rows.get(ref)
            if not ref.isdigit():
                status = Status(Phase.ended, reason=f"not a Slurm job id: {ref!r}")
            elif row is None:
                status = self._forgotten(ref)
            elif row.pending:
                status = Status(Phase.pending, reason=row.reason)
            elif row.terminal:
                status = self._ended(ref, row.state)
            else:
                status = Status(Phase.running)
            answer[job_id] = status
        with self._lock:
            for job_id, ref in references.items():
                if answer[job_id].phase is Phase.ended:
                    self._last.pop(ref, None)
                else:
                    self._last[ref] = answer[job_id]
        return answer

    def _ended(self, ref: str, state: str) -> Status:
        """A job Slurm lists as finished: its exit code and state from ``scontrol``."""
        try:
            record = self.cli.show_job(ref)
        except SlurmError:
            record = None
        code = parse_exit_code((record or {}).get("ExitCode"))
        # A job cancelled while pending ends with an empty NodeList and no BatchHost.
        never_ran = record is not None and record.get("BatchHost", "(null)") in ("", "(null)")
        return _ended_status(state, code, never_ran=never_ran)

    def _forgotten(self, ref: str) -> Status:
        """A job Slurm no longer lists: purged after MinJobAge. Accounting (or the completion
        log) may still know how it ended; either way it is over."""
        try:
            found = self.cli.sacct(ref)
        except SlurmError:
            found = None
        if found is None:
            return Status(Phase.ended, reason="Slurm no longer knows the job (purged)")
        return _ended_status(*found)

    def adopt(self, reference: str) -> bool:
        """Alive when Slurm lists it as pending or running; when Slurm cannot be asked, assumed
        alive (``describe`` settles it once Slurm answers) rather than ended by guesswork."""
        if not reference.isdigit():
            return False
        try:
            row = self.cli.squeue([reference]).get(reference)
        except SlurmError as exc:
            logger.warning("Slurm job %s: squeue failed at adoption (%s); watching it", reference,
                           exc)
            return True
        return row is not None and not row.terminal

    def reachable(self, reference: str) -> bool:
        """Slurm jobs are asked about by id, from any host that can run Slurm's commands."""
        return True

    def reference_from_claim(self, claim: Mapping[str, object]) -> str | None:
        """The Slurm job id the batch script's attempt loop wrote into its claim (``SLURM_JOB_ID``)."""
        job_id = claim.get("slurm_job_id")
        return job_id if isinstance(job_id, str) and job_id.isdigit() else None

    def cancel(self, reference: str, grace_s: float) -> None:
        """``scancel``: Slurm sends every step and the batch script SIGTERM, then SIGKILL after
        the cluster's ``KillWait``; returns once Slurm lists the job as finished (nothing of it
        runs on any node) or after ``CANCEL_WAIT_S``. A job already gone is not an error."""
        if not reference.isdigit():
            return
        self.cli.scancel(reference)
        deadline = time.monotonic() + max(grace_s, 0) + CANCEL_WAIT_S
        while time.monotonic() < deadline:
            try:
                row = self.cli.squeue([reference]).get(reference)
            except SlurmError:
                row = None  # keep trying until the deadline
            else:
                if row is None or row.terminal:
                    return
            time.sleep(CANCEL_POLL_S)
        logger.warning("Slurm job %s: still not finished %.0f s after scancel", reference,
                       CANCEL_WAIT_S)

    # --- output -----------------------------------------------------------------------------
    def rank_log(self, run: RunDir, attempt: int, rank: int, stream: LogStreamName) -> RankLog:
        """Global ``rank`` → node ``rank // nproc_per_node``, local rank ``rank % nproc``."""
        nproc = _nproc_per_node(run)
        node_index, local_rank = rank_location(rank, nproc)
        name_file = run.node_name_file(attempt, node_index)
        node_dir = name_file.parent
        root = run.root.resolve()
        # The job writes these files: one that is (or passes through) a symlink out of the run
        # directory is not read; regular files only (a FIFO would hold the reading thread).
        node = read_node_name(run, attempt, node_index) if _inside(name_file, root) else None
        if stream == "combined":  # service.run.ranktee wrote it on the node, named by global rank
            output = run.rank_output(attempt, rank)
            found_output = _inside(output, root) and is_regular(output)
            return RankLog(rank=rank, node=node, path=output if found_output else None)
        pattern = f"*/attempt_*/{int(local_rank)}/{stream}.log"
        found = sorted(
            (p for p in node_dir.glob(pattern) if _inside(p, root)), key=lambda p: p.stat().st_mtime
        )
        return RankLog(rank=rank, node=node, path=found[-1] if found else None)

    def nodes(self, partition: str | None) -> list[NodeRow]:
        """The partition's nodes and their state (``sinfo``), for ``/resources``."""
        return self.cli.sinfo(partition)


def _ended_status(
    state: str, code: tuple[int, int] | None, never_ran: bool = False
) -> Status:
    detail = f"Slurm: {state}" + (f" (exit {code[0]}:{code[1]})" if code else "")
    exit_code = None if code is None else (-code[1] if code[1] else code[0])
    return Status(Phase.ended, exit_code=exit_code, reason=detail,
                  cancelled=state.startswith("CANCELLED"), never_ran=never_ran)


def _inside(path: Path, root: Path) -> bool:
    """Read only what resolves inside the run directory (the trusted roots' rule)."""
    return resolves_inside(path, [root]) is not None


def _nproc_per_node(run: RunDir) -> int:
    """From the attempt loop's ``launch.json`` (written before submit; no secrets)."""
    try:
        return max(1, int(json.loads(read_bytes(run.launch_file, LAUNCH_FILE_MAX_BYTES) or b"")
                          ["nproc_per_node"]))
    except (OSError, ValueError, KeyError, TypeError):
        return 1
