"""The local executor: each job's attempt loop (``python -m service.run.attemptloop RUN_DIR``) runs as a
process group of its own on the server's host, so the job outlives a server restart.

Reference: JSON ``{"pid": <attempt loop pid>, "create_time": <its start, epoch seconds>, "host": <host>,
"start_ticks": <its start, clock ticks since boot>}`` — the start (in ticks where the reference
has them: ``proctree.start_ticks``) tells the attempt loop from a later process that reused its pid; the
host says where the pid means anything: a supervisor on another host (a standby that took over) leaves the job
alone (``reachable``). References from before ``host`` was added are taken as this host's. Logs:
torchrun's per-rank files under
``RUN_DIR/logs/attempt-<n>/<run id>/attempt_0/<rank>/{stderr,stdout}.log``, and both streams in
one file, ``RUN_DIR/logs/attempt-<n>/rank-<rank>.log`` (``service.run.ranktee``).
"""

import logging
import os
import select
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from service.executor.asuser import credentials, why_user_cannot_start
from service.executor.base import (
    DryRun,
    ExecutorError,
    LogStreamName,
    NodeRow,
    Phase,
    RankLog,
    Status,
    Submission,
)
from service.executor.reference import (
    NAME,
    claim_reference,
    decode_reference,
    encode_reference,
    reference_host,
)
from service.executor.spareloop import SpareLoop
from service.executor.warmpool import WarmPool
from service.run.proctree import ProcessGroupHandle, create_time, same_process, start_ticks
from service.run.warm import COLD_ENV, SOCKET_ENV
from torchyard_contract import runwrite
from torchyard_contract.childenv import environ_for_children
from torchyard_contract.rundir import RunDir

logger = logging.getLogger(__name__)



def build_attempt_loop_command(python: str, run: RunDir) -> list[str]:
    """The argv of a job's attempt loop; pure."""
    return [python, "-m", "service.run.attemptloop", str(run.root)]


class LocalExecutor:
    """Jobs as local process groups. ``python``: the interpreter that runs the attempt loop."""

    name = NAME
    queues_jobs = False
    outcome_visible_within_s = 0.0
    excludes_nodes = False  # one host: retry_elsewhere retries in place
    spans_nodes = False

    def __init__(
        self, python: str | None = None, warm: WarmPool | None = None, spare_loop: bool = False,
        user_python: str | None = None,
    ) -> None:
        self.python = python or sys.executable
        # A job that runs as its team's Unix user starts its attempt loop as that user, who must
        # be able to run the interpreter: the ranks' (``TORCHYARD_PYTHON_EXECUTABLE``) when set,
        # as the server's own may sit where only the server's user can reach it.
        self.user_python = user_python or self.python
        self.warm = warm  # warm ranks (docs/warm-ranks.md); None = every job starts cold
        # An attempt loop started ahead of the next job (``service.executor.spareloop``); the first job
        # after start starts its own.
        self.spare = SpareLoop(self.python) if spare_loop else None
        # Attempt loops this process started (their exit codes can be read) or adopted, by reference.
        self._handles: dict[str, ProcessGroupHandle] = {}
        self._lock = threading.Lock()
        self._users_who_can_start: set[int] = set()  # uids whose import check passed
        self._wake: Callable[[], None] | None = None

    def preflight(self, runs_dir: Path, api_url: str) -> None:
        """Nothing to check: the attempt loop and the ranks run on this host."""

    def watch(self, wake: Callable[[], None]) -> None:
        self._wake = wake

    def nodes(self, partition: str | None) -> list[NodeRow]:
        return []  # one host: its GPUs and CPU slots are the supervisor's inventory

    def dry_run(self, sub: Submission) -> DryRun:
        return DryRun(
            argv=tuple(build_attempt_loop_command(
                self.python if sub.run_as is None else self.user_python, sub.run)),
            cwd=sub.run.root,
            env_names=tuple(sorted(sub.env)),
        )

    def submit(self, sub: Submission) -> str:
        """A job with ``run_as`` (the server is root): its attempt loop starts as that user
        (:func:`credentials`), with the user's ``HOME``, ``USER`` and ``LOGNAME``, never in the
        spare attempt loop (the server's user), and its warm ranks come from that user's own warm
        server (``WarmPool.socket_for_launch``)."""
        plan = self.dry_run(sub)
        env = {**environ_for_children(os.environ), **sub.env}
        env.pop(SOCKET_ENV, None)
        env.pop(COLD_ENV, None)
        if sub.run_as is not None:
            if os.geteuid() != 0:
                raise ExecutorError(f"cannot run job {sub.job_id} as {sub.run_as.user}: "
                                    "only a server running as root can")
            env.update(sub.run_as.login_env())
            self._check_user_can_start(sub, env)
        if self.warm is not None:  # read (and removed) by the attempt loop
            warm_socket, why_cold = self.warm.socket_for_launch(sub.run_as)
            if warm_socket is not None:
                env[SOCKET_ENV] = warm_socket
            else:
                env[COLD_ENV] = why_cold
        spare = self.spare if sub.run_as is None else None
        popen = spare.take(sub.run, env) if spare is not None else None
        if popen is None:
            # Confined: the run directory may be the job's user's (a planted attempt-loop.log link).
            log = runwrite.open_append(sub.run.attempt_loop_log)
            try:
                popen = subprocess.Popen(
                    list(plan.argv),
                    cwd=plan.cwd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    **credentials(sub.run_as),  # type: ignore[arg-type]
                )
            finally:
                os.close(log)
        if spare is not None:
            spare.refill()
        reference = encode_reference(popen.pid, create_time(popen.pid), socket.gethostname(),
                                     start_ticks(popen.pid))
        with self._lock:
            self._handles[reference] = ProcessGroupHandle(pid=popen.pid, popen=popen)
        # Reap at once when the attempt loop exits, not up to a poll interval later.
        threading.Thread(
            target=self._wake_on_exit, args=(popen,), daemon=True,
            name=f"torchyard-wait-{sub.job_id}",
        ).start()
        return reference

    def _check_user_can_start(self, sub: Submission, env: Mapping[str, str]) -> None:
        """Raise ``ExecutorError`` (the job fails, saying why) when ``sub.run_as`` cannot import
        the attempt loop with ``user_python`` (``asuser.why_user_cannot_start``); checked once per
        user while it passes, so a fixed permission needs no restart."""
        assert sub.run_as is not None
        if sub.run_as.uid in self._users_who_can_start:
            return
        why = why_user_cannot_start(self.user_python, sub.run_as, env)
        if why is not None:
            raise ExecutorError(f"cannot run job {sub.job_id} as {sub.run_as.user}: {why}")
        with self._lock:
            self._users_who_can_start.add(sub.run_as.uid)

    def _wake_on_exit(self, popen: subprocess.Popen[bytes]) -> None:
        popen.wait()
        if self._wake is not None:
            self._wake()

    def _wake_when_gone(self, pid: int) -> None:
        """An adopted attempt loop is not our child: its exit is seen through a pidfd (Linux 5.3+),
        so the supervisor is told at once there too; elsewhere its poll finds it."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return
        try:
            select.select([fd], [], [])
        finally:
            os.close(fd)
        if self._wake is not None:
            self._wake()

    def describe(self, references: Mapping[int, str]) -> dict[int, Status]:
        return {job_id: self._describe_one(ref) for job_id, ref in references.items()}

    def _describe_one(self, reference: str) -> Status:
        with self._lock:
            handle = self._handles.get(reference)
        if handle is not None and handle.popen is not None:
            code = handle.popen.poll()
            if code is None:
                return Status(Phase.running)
            with self._lock:
                self._handles.pop(reference, None)
            return Status(Phase.ended, exit_code=code)
        # Adopted (not our child): alive or gone, the exit code is lost.
        decoded = decode_reference(reference)
        if decoded is not None and same_process(*decoded):
            return Status(Phase.running)
        with self._lock:
            self._handles.pop(reference, None)
        return Status(Phase.ended)

    def adopt(self, reference: str) -> bool:
        decoded = decode_reference(reference)
        if decoded is None or not same_process(*decoded):
            return False
        with self._lock:
            known = reference in self._handles
            self._handles.setdefault(reference, ProcessGroupHandle(pid=decoded[0]))
        if not known:
            threading.Thread(target=self._wake_when_gone, args=(decoded[0],), daemon=True,
                             name=f"torchyard-wait-{decoded[0]}").start()
        return True

    def reachable(self, reference: str) -> bool:
        """Only on the host that started it (pids mean nothing elsewhere)."""
        host = reference_host(reference)
        return host is None or host == socket.gethostname()

    def reference_from_claim(self, claim: Mapping[str, object]) -> str | None:
        """The attempt loop's own pid, start and host, as it claimed its run directory."""
        return claim_reference(claim)

    def cancel(self, reference: str, grace_s: float) -> None:
        with self._lock:
            handle = self._handles.get(reference)
        if handle is None:
            decoded = decode_reference(reference)
            if decoded is None or not same_process(*decoded):
                return  # already gone (or its pid now belongs to someone else)
            handle = ProcessGroupHandle(pid=decoded[0])
        handle.terminate(grace_s)

    def rank_log(
        self, run: RunDir, attempt: int, rank: int, stream: LogStreamName
    ) -> RankLog:
        """The newest torchrun run id's file if several; every path part is an int or fixed."""
        if stream == "combined":
            output = run.rank_output(attempt, rank)
            return RankLog(rank=rank, node=None, path=output if output.exists() else None)
        pattern = f"attempt-{int(attempt)}/*/attempt_*/{int(rank)}/{stream}.log"
        found = sorted(run.logs_dir.glob(pattern), key=_mtime)
        path: Path | None = found[-1] if found else None
        return RankLog(rank=rank, node=None, path=path)


def _mtime(path: Path) -> float:
    """For ordering a job's files: lstat, so a dangling symlink it left is no error."""
    try:
        return path.lstat().st_mtime
    except OSError:
        return 0.0
