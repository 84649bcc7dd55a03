"""Per-job shim: ``python -m service.run.attemptloop RUN_DIR``. Owns torchrun for the job's whole life.

The job's attempt loop, independent of how it was started: the local executor starts one shim per
job in a session of its own (so the job outlives the server); a batch script can run the same
loop inside an allocation. The shim runs attempts (torchrun with ``--max-restarts=0``), restarts the group after a rank
failure up to ``max_restarts`` (never after a start-up failure: a failure before every rank wrote
its ready marker), runs every rank under ``service.run.ranktee`` (both streams in one file per rank),
enforces ``max_runtime_s`` and ``heartbeat_timeout_s`` (``max_runtime_s`` between attempts too:
the retry rules' matching is bounded by what is left of it, the backoff ends at it, and no attempt
starts after it), and writes:

* ``attempts/<n>.json`` — number, started_at, ended_at, exit_code, rank_exit_codes (per rank,
  as torchrun's failure summary gives them; all 0 on success), reason, startup_failure;
* ``exit.json`` — the launch's outcome: state (succeeded|failed|cancelled|paused|requeue),
  exit_code, reason; ``requeue`` (Slurm, ``retry_elsewhere``) also ``exclude_nodes``: the job is
  to be submitted again without the failing rank's node (``service.run.elsewhere``).

A pause (``RUN_DIR/pause.json``, ``service.run.pausing``) ends the attempt with the ranks'
grace; the outcome is ``paused`` and a resumed job's next launch numbers its attempts on.

Launchers (``--launcher``): ``local`` (default) runs each attempt's torchrun on this host;
``slurm`` — inside a Slurm allocation, on its batch host — runs each attempt as one job step,
``srun`` starting torchrun on every node with a static rendezvous here
(``service.executor.slurmscript``), and exits with the outcome's exit code (the batch script
``exec``s the shim, so Slurm's record of the job carries the last attempt's real exit code).

Input: ``RUN_DIR/launch.json`` (see ``LaunchConfig``: among others the rank program argv, the
built-in trainer or a script job's resolved script and args) and the rank environment in its own
environment (the job token never touches the disk). A job that runs as its team's Unix user
(``LaunchConfig.run_as``) is started as that user by its executor; the shim checks it is, before
it claims anything (:func:`wrong_user`), and everything it starts inherits that user. SIGTERM means cancel: the group gets
SIGTERM → grace → SIGKILL and the outcome is ``cancelled``. Never imports torch.

The shim is the child subreaper of the job (``service.run.proctree``): when an attempt's torchrun
has exited, every process still below the shim — a child the job started in a session of its
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

from service.run import fastexit, ranktee, stacks
from service.run.exitreason import describe_exit, failed_rank_exit_codes
from service.run.pausing import PAUSED_REASON, PauseWatch
from service.run.proctree import (
    ProcessGroupHandle,
    become_subreaper,
    create_time,
    start_ticks,
    stop_descendants,
)
from service.run.socketport import free_port
from service.run.srun import StepRequest, build_srun_command
from service.run.torchrun import LaunchRequest, LocalTorchrunLauncher
from service.run.warm import COLD_ENV, RELAY_PATH, SOCKET_ENV
from torchyard_contract import claim as runclaim
from torchyard_contract import envnames as names
from torchyard_contract.launch import LaunchConfig
from torchyard_contract.rundir import RunDir
from torchyard_contract.runfiles import REQUEUE, read_attempts

POLL_S = 0.2
STRAY_GRACE_S = 2.0  # SIGTERM → this → SIGKILL for processes a finished attempt left behind
DEADLINE_REASON = "deadline exceeded"


def _wait_exit(handle: ProcessGroupHandle, timeout_s: float) -> None:
    """Sleep up to ``timeout_s``, waking as soon as torchrun exits (not up to a poll later)."""
    try:
        handle.popen.wait(timeout=timeout_s)  # type: ignore[union-attr]
    except subprocess.TimeoutExpired:
        pass


def _write_json(path: Path, data: dict) -> None:
    """Atomic: readers never see half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


class Shim:
    def __init__(
        self, run: RunDir, config: LaunchConfig, launcher: str = "local",
        warm_socket: str | None = None, why_cold: str | None = None,
    ) -> None:
        self.run, self.config, self.launcher = run, config, launcher
        self.warm_socket = warm_socket  # warm ranks (service.run.warm, local only); None = cold
        self.why_cold = why_cold  # warm ranks are on but the pool could not serve this job
        self.cancelled = False
        self.started = time.time()
        self.stopped_by_shim = False
        self.pause = PauseWatch(run, config, launcher, warm_socket)
        # A resumed (or restarted elsewhere) job's run directory holds its earlier launches'
        # attempts: numbering goes on after them; the ones a pause ended used no restart, one
        # a requeue ended (retry_elsewhere) failed and used one, as a retry in place does.
        earlier = read_attempts(run)
        self.first_number = 1 + max((a["number"] for a in earlier), default=0)
        self.paused_attempts = sum(1 for a in earlier if a.get("paused"))

    def on_sigterm(self, _signum: int, _frame: object) -> None:
        self.cancelled = True

    def run_attempt(self, number: int) -> tuple[int, str | None, bool]:
        """Run one attempt; returns (exit code, reason or None, startup_failure)."""
        logs = self.run.logs_dir / f"attempt-{number}"
        logs.mkdir(parents=True, exist_ok=True)
        env = {
            names.ATTEMPT: str(number),
            **self.config.rank_env(os.environ.get("PYTHONPATH")),
        }
        if self.warm_socket:
            env[names.STACKS_TRACER] = str(os.getpid())
        record = {
            "number": number,
            "started_at": time.time(),
            "ended_at": None,
            "exit_code": None,
            "reason": None,
            "startup_failure": None,
        }
        _write_json(self.run.attempt_file(number), record)
        if self.why_cold:
            with open(logs / "torchrun.log", "a", encoding="utf-8") as log:
                log.write(f"torchyard: warm start unavailable ({self.why_cold}); starting cold\n")
        handle = self._start(number, logs, env)
        forced_reason: str | None = None
        while (code := handle.poll()) is None:
            stacks.answer_requests(self.run, self.config, number, self.launcher,
                                   self.warm_socket)  # GET .../stacks
            forced_reason = self._why_stop(number)
            if forced_reason is None and self.pause.grace_over():
                forced_reason = PAUSED_REASON  # the ranks had their grace; stop what is left
            if forced_reason is not None:
                handle.terminate(self.config.stop_grace_s)
                code = handle.poll()
                break
            _wait_exit(handle, POLL_S)
        code = code if code is not None else -signal.SIGKILL
        self.stopped_by_shim = forced_reason is not None  # retry rules: only for failures of the job
        # torchrun is gone: whatever the job started and left (its own session, a daemon) goes
        # too, before the next attempt or the outcome (service.run.proctree).
        strays = stop_descendants(min(self.config.stop_grace_s, STRAY_GRACE_S))
        if strays:
            print(f"attempt {number}: stopped {len(strays)} leftover process(es) of the job",
                  flush=True)
        ready = all(
            self.run.ready_marker(number, r).exists() for r in range(self.config.world_size)
        )
        paused = self.pause.requested and not self.cancelled
        if paused:
            reason = PAUSED_REASON  # however the ranks ended: they were asked to stop
        elif forced_reason is not None:
            reason = forced_reason  # torchrun may exit 0 on SIGTERM; the stop still failed it
        elif code == 0:
            reason = None
        else:
            reason = describe_exit(code, logs, self._launcher_logs(logs)[0],
                                   self.config.nproc_per_node)
        if code == 0:
            rank_codes = {str(r): 0 for r in range(self.config.world_size)}
        else:
            rank_codes = {
                str(r): c
                for log in self._launcher_logs(logs)
                for r, c in failed_rank_exit_codes(log).items()
            }
        record.update(
            ended_at=time.time(),
            exit_code=code,
            reason=reason,
            rank_exit_codes=rank_codes,
            startup_failure=(code != 0 and not ready and forced_reason is None and not paused),
        )
        if paused:
            record["paused"] = True
        _write_json(self.run.attempt_file(number), record)
        return code, reason, bool(record["startup_failure"])

    def _start(self, number: int, logs: Path, env: dict[str, str]) -> ProcessGroupHandle:
        """Start one attempt's group: torchrun here, or (slurm) one torchrun per node via srun."""
        # Each rank under service.run.ranktee: both streams also in one file, in the order written.
        # Warm: the tee (stdlib only, quick to start cold) runs the relay, whose warm process
        # becomes the rank program itself. Cold: a ``-m`` program ends without tearing torch down.
        rank_program = self.config.rank_program(self.run)
        if self.warm_socket:
            rank_program = (str(RELAY_PATH), self.warm_socket, *rank_program)
        else:
            rank_program = fastexit.wrap(rank_program)
        program = ranktee.wrap(self.run, number, rank_program)
        if self.launcher != "slurm":
            req = LaunchRequest(
                job_id=self.config.job_id,
                python=self.config.python,
                nproc_per_node=self.config.nproc_per_node,
                master_port=free_port(),
                run_dir=self.run.root,
                logs_dir=logs,
                program=program,
                env=env,
                relay=(str(RELAY_PATH), self.warm_socket) if self.warm_socket else None,
                cwd=Path(self.config.cwd(self.run)),
            )
            return LocalTorchrunLauncher().start(req, new_session=False)
        step = StepRequest(
            python=self.config.python,
            nnodes=self.config.nnodes,
            nproc_per_node=self.config.nproc_per_node,
            # Rank 0's store listens here, the batch host, on a port free here now.
            master_addr=socket.gethostname(),
            master_port=free_port(""),
            logs_dir=logs,
            program=program,
            gpus_per_node=self.config.gpus_per_node,
        )
        with open(logs / "srun.log", "ab") as log:
            popen = subprocess.Popen(
                build_srun_command(step),
                cwd=self.config.cwd(self.run),
                env={**os.environ, **env},
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        return ProcessGroupHandle(pid=popen.pid, popen=popen)

    def _launcher_logs(self, logs: Path) -> list[Path]:
        """torchrun's own output: one file here, one per node (``node-<k>.log``) on Slurm; the
        first one names the failure when no rank left an error file."""
        if self.launcher != "slurm":
            return [logs / "torchrun.log"]
        nodes = sorted(logs.glob("node-*.log"), key=lambda p: p.name)
        return [*nodes, logs / "srun.log"] if nodes else [logs / "srun.log"]

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
                    return stacks.hang_reason(  # names it
                        self.run, cfg, number, stuck, self.launcher, self.warm_socket)
        return None

    def main(self) -> int:
        number = self.first_number
        while True:
            if self.pause.requested and not self.cancelled:  # asked between two attempts
                outcome = {"state": "paused", "exit_code": None, "reason": PAUSED_REASON}
                number -= 1
                break
            code, reason, startup = self.run_attempt(number)
            stacks.keep_with_attempt(self.run, number)  # the hang's stacks, Flight Recorder dumps
            if self.cancelled:
                outcome = {"state": "cancelled", "exit_code": code, "reason": "cancelled by user"}
                break
            if reason == PAUSED_REASON:
                outcome = {"state": "paused", "exit_code": code, "reason": PAUSED_REASON}
                break
            if code == 0 and reason is None:
                outcome = {"state": "succeeded", "exit_code": 0, "reason": None}
                break
            failures = number - self.paused_attempts  # attempts a pause ended are no failures
            last = startup or failures > self.config.max_restarts or reason == DEADLINE_REASON
            # --- retries decided by the cause (service.run.retrydecision) ---
            if not startup and reason != DEADLINE_REASON and not self.stopped_by_shim:
                # Imported here, at the first failure: its rules are pydantic models (~0.15 CPU s
                # to import), and most shims — every standby one among them — never need it.
                from service.run import retrydecision

                decided = retrydecision.decide_attempt(
                    self.run, self.config, number, reason, failures, self.launcher == "slurm",
                    budget_s=retrydecision.budget_s(self.started, self.config.max_runtime_s))
                last, reason = not decided.retry, decided.reason
                if not last:
                    retrydecision.wait_backoff(
                        decided.backoff_s,
                        lambda: self.cancelled or self.pause.requested or self._past_deadline())
                if not last and self._past_deadline():  # no restart after the deadline
                    last, reason = True, DEADLINE_REASON
                if not last and decided.excluded_node is not None:
                    # retry_elsewhere (Slurm): end this allocation; the server submits the job
                    # again without the node (service.run.elsewhere). A failure all the same.
                    print(f"attempt {number}: ending the allocation to restart without node "
                          f"{decided.excluded_node}", flush=True)
                    outcome = (
                        {"state": "cancelled", "exit_code": code, "reason": "cancelled by user"}
                        if self.cancelled else
                        {"state": REQUEUE, "exit_code": code, "reason": decided.summary,
                         "exclude_nodes": [decided.excluded_node]}
                    )
                    break
            # --- end retries decided by the cause ---
            if last:
                if startup:
                    reason = f"start-up failure (not retried): {reason}"
                outcome = {"state": "failed", "exit_code": code, "reason": reason}
                break
            number += 1
        outcome.update(attempts=number, ended_at=time.time())
        _write_json(self.run.exit_file, outcome)
        if self.launcher != "slurm":
            return 0
        return exit_status(outcome["exit_code"])


def exit_status(code: int | None) -> int:
    """A process exit status for an attempt's exit code (a signal -N becomes 128+N)."""
    if code is None:
        return 1
    return 128 - code if code < 0 else min(code, 255)


def wrong_user(config: LaunchConfig) -> str | None:
    """Why this process must not run the job: it is not the user and group the job runs as
    (``LaunchConfig.run_as``: its team's Unix user). None when it is, or the job names none."""
    want = config.run_as
    if want is None or (os.getuid(), os.getgid()) == (want.uid, want.gid):
        return None
    return (f"it runs as {want.user} (uid {want.uid}, gid {want.gid}); this process is uid "
            f"{os.getuid()}, gid {os.getgid()}")


def read_standby_request() -> str:
    """``--standby`` (``service.executor.standby``): wait for one JSON line on stdin, ``{"run":
    RUN_DIR, "env": {...}}``, then take that job's environment, directory and log (stdout and
    stderr to ``RUN_DIR/shim.log``, stdin from /dev/null), as a shim started for it would have
    them. End of input (the server went away) means exit. Returns RUN_DIR."""
    line = sys.stdin.buffer.readline()
    if not line:
        sys.exit(0)
    request = json.loads(line)
    root = str(request["run"])
    os.environ.clear()
    os.environ.update({str(k): str(v) for k, v in request["env"].items()})
    os.chdir(root)
    log = os.open(os.path.join(root, "shim.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, target in ((null, 0), (log, 1), (log, 2)):
        os.dup2(fd, target)
    os.close(log)
    os.close(null)
    return root


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m service.run.attemptloop")
    parser.add_argument("--launcher", choices=("local", "slurm"), default="local")
    parser.add_argument(
        "--standby", action="store_true",
        help="wait for a run directory and environment on stdin (service.executor.standby)",
    )
    parser.add_argument("run_dir", type=Path, nargs="?")
    args = parser.parse_args()
    root = Path(read_standby_request()) if args.standby else args.run_dir
    if root is None:
        parser.error("run_dir is required without --standby")
    # Before anything starts: every process of the job then stays in this process's tree.
    if not become_subreaper():
        print("not a child subreaper (no prctl): daemons a job leaves may outlive it", flush=True)
    run = RunDir(root.resolve())
    try:
        config = LaunchConfig.read(run)
    except FileNotFoundError:
        # A server that died before writing launch.json gave the launch up on its recovery (it
        # claimed it): a late start runs nothing, and says so.
        if (other := runclaim.read_claim(run)) is not None:
            print(f"shim: not running job: the launch was claimed already: {other}",
                  file=sys.stderr)
            sys.exit(0)
        raise
    if (wrong := wrong_user(config)) is not None:  # before the claim: this process runs nothing
        print(f"shim: not running job {config.job_id}: {wrong}", file=sys.stderr, flush=True)
        sys.exit(1)
    # First of all: claim the launch, unless a recovering server gave it up (torchyard_contract.claim).
    me = os.getpid()
    mine = {"pid": me, "create_time": create_time(me), "start_ticks": start_ticks(me),
            "host": socket.gethostname()}
    if args.launcher == "slurm" and os.environ.get("SLURM_JOB_ID"):
        mine["slurm_job_id"] = os.environ["SLURM_JOB_ID"]  # how the Slurm executor adopts it
    if (other := runclaim.claim(run, mine)) is not None:
        print(f"shim: not running job: the launch was claimed already: {other}", file=sys.stderr)
        sys.exit(0)
    # The executor's, for this process only: torchrun and the ranks do not inherit it.
    warm_socket = os.environ.pop(SOCKET_ENV, None)
    why_cold = os.environ.pop(COLD_ENV, None)
    shim = Shim(run, config, args.launcher, warm_socket, why_cold)
    signal.signal(signal.SIGTERM, shim.on_sigterm)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the server's terminal going away is not a cancel
    sys.exit(shim.main())


if __name__ == "__main__":
    main()
