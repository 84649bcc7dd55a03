"""Per-job attempt loop: ``python -m service.run.attemptloop RUN_DIR``. Owns torchrun for the job's whole life.

The job's attempt loop, independent of how it was started: the local executor starts one attempt loop per
job in a session of its own (so the job outlives the server); a batch script can run the same
loop inside an allocation. The attempt loop runs attempts (torchrun with ``--max-restarts=0``), restarts the group after a rank
failure up to ``max_restarts`` (never after a start-up failure: a failure before every rank wrote
its ready marker), runs every rank under ``service.run.ranktee`` (both streams in one file per rank),
enforces ``max_runtime_s`` and ``heartbeat_timeout_s`` (``max_runtime_s`` between attempts too:
the retry rules' matching is bounded by what is left of it, the backoff ends at it, and no attempt
starts after it), and writes:

* ``attempts/<n>.json`` (``torchyard_contract.runfiles.AttemptFile``) — number, started_at,
  ended_at, exit_code, rank_exit_codes (per rank, as torchrun's failure summary gives them; all
  0 on success), reason, startup_failure, paused;
* ``exit.json`` (``Outcome``) — the launch's outcome: state (``OutcomeState``), exit_code,
  reason, the last attempt's number and when it ended; ``requeue`` (Slurm, ``retry_elsewhere``)
  also ``exclude_nodes``: the job is to be submitted again without the failing rank's node
  (``service.run.elsewhere``).

A pause (``RUN_DIR/pause.json``, ``service.run.pausesignal``) ends the attempt with the ranks'
grace; the outcome is ``paused`` and a resumed job's next launch numbers its attempts on.

The launcher (``--launcher``, ``service.run.launcher``, chosen once at start) is what differs
between where the ranks run: ``local`` (default) runs each attempt's torchrun on this host;
``slurm`` — inside a Slurm allocation, on its batch host (``service.executor.slurmscript``) —
runs each attempt as one job step, ``srun`` starting torchrun on every node with a static
rendezvous here, and exits with the outcome's exit code (the batch script ``exec``s the attempt
loop, so Slurm's record of the job carries the last attempt's real exit code).

Input: ``RUN_DIR/launch.json`` (see ``LaunchConfig``: among others the rank program argv, the
built-in trainer or a script job's resolved script and args) and the rank environment in its own
environment (the job token never touches the disk). A job that runs as its team's Unix user
(``LaunchConfig.run_as``) is started as that user by its executor; the attempt loop checks it is, before
it claims anything (:func:`wrong_user`), and everything it starts inherits that user. SIGTERM means cancel: the group gets
SIGTERM → grace → SIGKILL and the outcome is ``cancelled``. Never imports torch.

The attempt loop is the child subreaper of the job (``service.run.proctree``): when an attempt's torchrun
has exited, every process still below the attempt loop — a child the job started in a session of its
own, a double-forked daemon — is stopped (SIGTERM, up to ``STRAY_GRACE_S``, SIGKILL) before the
next attempt starts or the outcome is written, so no process of the job outlives it.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from service.run import ranktee, stackdump
from service.run.exitreason import (
    describe_exit,
    failed_rank_exit_codes,
    log_sizes,
    rendezvous_port_taken,
)
from service.run.launcher import LAUNCHERS, Launcher, LocalLauncher, launcher_for
from service.run.pausesignal import PAUSED_REASON, PauseWatch
from service.run.proctree import (
    ProcessGroupHandle,
    become_subreaper,
    create_time,
    start_ticks,
    stop_descendants,
)
from service.run.warm import COLD_ENV, SOCKET_ENV
from torchyard_contract import claim as runclaim
from torchyard_contract import envnames as names
from torchyard_contract import runwrite
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import (
    AttemptFile,
    Outcome,
    OutcomeState,
    made,
    read_attempts,
    write_run_file,
)

POLL_S = 0.2
STRAY_GRACE_S = 2.0  # SIGTERM → this → SIGKILL for processes a finished attempt left behind
PORT_TAKEN_STARTS = 3  # starts of one attempt whose rendezvous port another process took
DEADLINE_REASON = "deadline exceeded"
CANCELLED_REASON = "cancelled by user"


def _wait_exit(handle: ProcessGroupHandle, timeout_s: float) -> None:
    """Sleep up to ``timeout_s``, waking as soon as torchrun exits (not up to a poll later)."""
    try:
        handle.popen.wait(timeout=timeout_s)  # type: ignore[union-attr]
    except subprocess.TimeoutExpired:
        pass


class AttemptLoop:
    """One launch of a job: its attempts until the outcome (module docstring). ``launcher``:
    where its ranks run (``service.run.launcher``; default: this host, cold)."""

    def __init__(
        self, run: RunDir, config: LaunchConfig, launcher: Launcher | None = None,
    ) -> None:
        self.run, self.config = run, config
        self.launcher = launcher if launcher is not None else LocalLauncher()
        self.cancelled = False
        self.started = time.time()
        self.stopped_by_loop = False
        self.pause = PauseWatch(run, config, self.launcher)
        # A resumed (or restarted elsewhere) job's run directory holds its earlier launches'
        # attempts: numbering goes on after them; the ones a pause ended used no restart, one
        # a requeue ended (retry_elsewhere) failed and used one, as a retry in place does.
        earlier = read_attempts(run)
        self.first_number = 1 + max((a["number"] for a in earlier), default=0)
        self.paused_attempts = sum(1 for a in earlier if a.get("paused"))
        self.restarts = config.budget(self.paused_attempts)  # torchyard_contract.attempts

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        self.cancelled = True

    def run_attempt(self, number: int) -> tuple[int, str | None, bool]:
        """Run one attempt; returns (exit code, reason or None, startup_failure)."""
        logs = self.run.logs_dir / f"attempt-{number}"
        logs.mkdir(parents=True, exist_ok=True)
        env = {
            names.ATTEMPT: str(number),
            **self.config.rank_env(os.environ.get("PYTHONPATH")),
            **self.launcher.attempt_env(),
        }
        record = made(AttemptFile, number=number, started_at=time.time())
        write_run_file(self.run.attempt_file(number), record)
        # Each rank under service.run.ranktee: both streams also in one file, in the order written.
        program = ranktee.wrap(self.run, number, self.launcher.rank_program(self.run, self.config))
        for start in range(1, PORT_TAKEN_STARTS + 1):
            since = log_sizes(self.launcher.torchrun_logs(logs))
            handle = self.launcher.start(self.run, self.config, logs, program, env)
            code, forced_reason = self._wait(handle, number)
            # torchrun is gone: whatever the job started and left (its own session, a daemon)
            # goes too, before the next start, attempt or the outcome (service.run.proctree).
            strays = stop_descendants(min(self.config.stop_grace_s, STRAY_GRACE_S))
            if strays:
                print(f"attempt {number}: stopped {len(strays)} leftover process(es) of the job",
                      flush=True)
            ready = all(
                self.run.ready_marker(number, r).exists() for r in range(self.config.world_size)
            )
            # The rendezvous port taken between finding it free and torchrun binding it: not
            # the job's failure, so the same attempt starts again on another port.
            if (code == 0 or ready or forced_reason is not None or start == PORT_TAKEN_STARTS
                    or not rendezvous_port_taken(self.launcher.torchrun_logs(logs), since)):
                break
            print(f"attempt {number}: the rendezvous port was taken before torchrun bound it; "
                  "starting again on another", flush=True)
        self.stopped_by_loop = forced_reason is not None  # retry rules: only for failures of the job
        paused = self.pause.requested and not self.cancelled
        if paused:
            reason = PAUSED_REASON  # however the ranks ended: they were asked to stop
        elif forced_reason is not None:
            reason = forced_reason  # torchrun may exit 0 on SIGTERM; the stop still failed it
        elif code == 0:
            reason = None
        else:
            reason = describe_exit(code, logs, self.launcher.torchrun_logs(logs)[0],
                                   self.config.nproc_per_node)
        if code == 0:
            rank_codes = {str(r): 0 for r in range(self.config.world_size)}
        else:
            rank_codes = {
                str(r): c
                for log in self.launcher.torchrun_logs(logs)
                for r, c in failed_rank_exit_codes(log).items()
            }
        startup = code != 0 and not ready and forced_reason is None and not paused
        record = record.model_copy(update={
            "ended_at": time.time(), "exit_code": code, "reason": reason,
            "rank_exit_codes": rank_codes, "startup_failure": startup,
            "paused": True if paused else None,
        })
        write_run_file(self.run.attempt_file(number), record)
        return code, reason, startup

    def _wait(self, handle: ProcessGroupHandle, number: int) -> tuple[int, str | None]:
        """Until torchrun exits, or the attempt loop stops it (the reason: cancel, deadline, a
        hang, the pause's grace over); answers stacks requests meanwhile."""
        forced_reason: str | None = None
        while (code := handle.poll()) is None:
            stackdump.answer_requests(self.run, self.config, number, self.launcher)  # GET .../stacks
            forced_reason = self._why_stop(number)
            if forced_reason is None and self.pause.grace_over():
                forced_reason = PAUSED_REASON  # the ranks had their grace; stop what is left
            if forced_reason is not None:
                handle.terminate(self.config.stop_grace_s)
                code = handle.poll()
                break
            _wait_exit(handle, POLL_S)
        return (code if code is not None else -signal.SIGKILL), forced_reason

    def _past_deadline(self) -> bool:
        """The job has run longer than its ``max_runtime_s``."""
        limit = self.config.max_runtime_s
        return limit is not None and time.time() - self.started > limit

    def _why_stop(self, number: int) -> str | None:
        if self.cancelled:
            return "cancelled"
        cfg = self.config
        if self._past_deadline():
            return DEADLINE_REASON
        if cfg.heartbeat_timeout_s is not None:
            now = time.time()
            for rank in range(cfg.world_size):
                marker = self.run.ready_marker(number, rank)
                try:
                    idle = now - marker.stat().st_mtime
                except FileNotFoundError:
                    continue  # still starting; start-up has its own failure path
                if idle > cfg.heartbeat_timeout_s:
                    stuck = f"rank {rank} made no progress for {cfg.heartbeat_timeout_s:g} s"
                    return stackdump.hang_reason(  # names it
                        self.run, cfg, number, stuck, self.launcher)
        return None

    def main(self) -> int:
        number = self.first_number
        while True:
            if self.pause.requested and not self.cancelled:  # asked between two attempts
                outcome = _outcome(OutcomeState.paused, None, PAUSED_REASON)
                number -= 1
                break
            code, reason, startup = self.run_attempt(number)
            stackdump.keep_with_attempt(self.run, number)  # the hang's stacks, Flight Recorder dumps
            if self.cancelled:
                outcome = _outcome(OutcomeState.cancelled, code, CANCELLED_REASON)
                break
            if reason == PAUSED_REASON:
                outcome = _outcome(OutcomeState.paused, code, PAUSED_REASON)
                break
            if code == 0 and reason is None:
                outcome = _outcome(OutcomeState.succeeded, 0, None)
                break
            failures = self.restarts.failures(number)  # attempts a pause ended are no failures
            last = (startup or not self.restarts.allows_restart(failures)
                    or reason == DEADLINE_REASON)
            # --- retries decided by the cause (service.run.retrydecision) ---
            if not startup and reason != DEADLINE_REASON and not self.stopped_by_loop:
                # Imported here, at the first failure: its rules are pydantic models (~0.15 CPU s
                # to import), and most attempt loops — every spare one among them — never need it.
                from service.run import retrydecision

                decided = retrydecision.decide_attempt(
                    self.run, self.config, number, reason, self.restarts,
                    self.launcher.excludes_nodes,
                    budget_s=retrydecision.budget_s(self.started, self.config.max_runtime_s))
                last, reason = not decided.retry, decided.reason
                if not last:
                    retrydecision.wait_backoff(
                        decided.decision.backoff_s,
                        lambda: self.cancelled or self.pause.requested or self._past_deadline())
                if not last and self._past_deadline():  # no restart after the deadline
                    last, reason = True, DEADLINE_REASON
                excluded = decided.decision.excluded_node
                if not last and excluded is not None:
                    # retry_elsewhere (Slurm): end this allocation; the server submits the job
                    # again without the node (service.run.elsewhere). A failure all the same.
                    print(f"attempt {number}: ending the allocation to restart without node "
                          f"{excluded}", flush=True)
                    outcome = (
                        _outcome(OutcomeState.cancelled, code, CANCELLED_REASON)
                        if self.cancelled else
                        _outcome(OutcomeState.requeue, code, decided.decision.summary,
                                 exclude_nodes=[excluded])
                    )
                    break
            # --- end retries decided by the cause ---
            if last:
                if startup:
                    reason = f"start-up failure (not retried): {reason}"
                outcome = _outcome(OutcomeState.failed, code, reason)
                break
            number += 1
        outcome = outcome.model_copy(update={"attempts": number, "ended_at": time.time()})
        write_run_file(self.run.exit_file, outcome)
        return self.launcher.exit_status(outcome.exit_code)


def _outcome(state: OutcomeState, code: int | None, reason: str | None, **more: object) -> Outcome:
    return made(Outcome, state=state, exit_code=code, reason=reason, **more)


def wrong_user(config: LaunchConfig) -> str | None:
    """Why this process must not run the job: it is not the user and group the job runs as
    (``LaunchConfig.run_as``: its team's Unix user). None when it is, or the job names none."""
    want = config.run_as
    if want is None or (os.getuid(), os.getgid()) == (want.uid, want.gid):
        return None
    return (f"it runs as {want.user} (uid {want.uid}, gid {want.gid}); this process is uid "
            f"{os.getuid()}, gid {os.getgid()}")


def read_spare_request() -> str:
    """``--spare`` (``service.executor.spareloop``): wait for one JSON line on stdin, ``{"run":
    RUN_DIR, "env": {...}}``, then take that job's environment, directory and log (stdout and
    stderr to ``RUN_DIR/attempt-loop.log``, stdin from /dev/null), as an attempt loop started for it would have
    them. End of input (the server went away) means exit. Returns RUN_DIR."""
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    request = json.loads(line)
    root = str(request["run"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    os.chdir(root)
    # Confined, as the executor opens it for an attempt loop it starts: never through a link.
    log = runwrite.open_append(RunDir(Path(root)).attempt_loop_log)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(log)
    os.close(null)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m service.run.attemptloop")
    parser.add_argument("--launcher", choices=LAUNCHERS, default="local",
                        help="where the ranks run (service.run.launcher)")
    parser.add_argument(
        "--spare", action="store_true",
        help="wait for a run directory and environment on stdin (service.executor.spareloop)",
    )
    parser.add_argument("run_dir", type=Path, nargs="?")
    args = parser.parse_args()
    root = Path(read_spare_request()) if args.spare else args.run_dir
    if root is None:
        parser.error("run_dir is required without --spare")
    # Before anything starts: every process of the job then stays in this process's tree.
    if not become_subreaper():
        print("not a child subreaper (no prctl): daemons a job leaves may outlive it", flush=True)
    run = RunDir(root.resolve())
    try:
        config = LaunchConfig.read(run)
    except ValueError:
        # No launch.json: a server that died before writing it gave the launch up on its
        # recovery (it claimed it), so a late start runs nothing, and says so.
        if (other := runclaim.read_claim(run)) is not None:
            print(f"attempt loop: not running job: the launch was claimed already: {other}",
                  file=sys.stderr)
            sys.exit(0)
        raise
    if (wrong := wrong_user(config)) is not None:  # before the claim: this process runs nothing
        print(f"attempt loop: not running job {config.job_id}: {wrong}", file=sys.stderr, flush=True)
        sys.exit(1)
    # First of all: claim the launch, unless a recovering server gave it up (torchyard_contract.claim).
    me = os.getpid()
    # The executor's, for this process only: torchrun and the ranks do not inherit it.
    warm_socket = os.environ.pop(SOCKET_ENV, None)
    why_cold = os.environ.pop(COLD_ENV, None)
    launcher = launcher_for(args.launcher, warm_socket, why_cold)
    mine = {"pid": me, "create_time": create_time(me), "start_ticks": start_ticks(me),
            "host": socket.gethostname(), **launcher.claim_fields()}
    if (other := runclaim.claim(run, mine)) is not None:
        print(f"attempt loop: not running job: the launch was claimed already: {other}", file=sys.stderr)
        sys.exit(0)
    loop = AttemptLoop(run, config, launcher)
    signal.signal(signal.SIGTERM, loop.on_sigterm)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the server's terminal going away is not a cancel
    sys.exit(loop.main())


if __name__ == "__main__":
    main()
