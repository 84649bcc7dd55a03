"""Per-job shim: ``python -m service.shim RUN_DIR``. Owns torchrun for the job's whole life.

The job's attempt loop, independent of how it was started: the local executor starts one shim per
job in a session of its own (so the job outlives the server); a batch script can run the same
loop inside an allocation. The shim runs attempts (torchrun with ``--max-restarts=0``), restarts the group after a rank
failure up to ``max_restarts`` (never after a start-up failure: a failure before every rank wrote
its ready marker), runs every rank under ``service.ranktee`` (both streams in one file per rank),
enforces ``max_runtime_s`` and ``heartbeat_timeout_s``, and writes:

* ``attempts/<n>.json`` — number, started_at, ended_at, exit_code, rank_exit_codes (per rank,
  as torchrun's failure summary gives them; all 0 on success), reason, startup_failure;
* ``exit.json`` — the job's outcome: state (succeeded|failed|cancelled), exit_code, reason.

Input: ``RUN_DIR/launch.json`` (see ``ShimConfig``: among others the rank program argv, the
built-in trainer or a script job's resolved script and args) and the rank environment in its own
environment (the job token never touches the disk). SIGTERM means cancel: the group gets
SIGTERM → grace → SIGKILL and the outcome is ``cancelled``. Never imports torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from service import ranktee
from service.executor.process import ProcessGroupHandle
from service.failure import describe_exit, failed_rank_exit_codes
from service.launcher import LaunchRequest, LocalTorchrunLauncher
from service.scriptpath import builtin_program
from service.socketport import free_port
from torchyard_contract import envnames as names
from torchyard_contract.rundir import RunDir

POLL_S = 0.2
DEADLINE_REASON = "deadline exceeded"


@dataclass(frozen=True)
class ShimConfig:
    job_id: int
    python: str
    nproc_per_node: int
    max_restarts: int
    max_runtime_s: float | None
    heartbeat_timeout_s: float | None
    stop_grace_s: float
    # What each rank runs after torchrun's options (``service.scriptpath.RankProgram``);
    # None = the built-in trainer (also what a launch.json from before script jobs means).
    program: list[str] | None = None
    pythonpath: str | None = None  # ``-m`` script jobs: the script directory holding the module

    @classmethod
    def read(cls, run: RunDir) -> ShimConfig:
        return cls(**json.loads(run.launch_file.read_text()))

    def rank_program(self, run: RunDir) -> tuple[str, ...]:
        if self.program is None:
            return builtin_program(run.spec_file).argv
        return tuple(self.program)

    def rank_env(self, inherited: str | None) -> dict[str, str]:
        """Extra variables of torchrun and the ranks (``inherited``: the shim's PYTHONPATH)."""
        if self.pythonpath is None:
            return {}
        path = os.pathsep.join(p for p in (self.pythonpath, inherited) if p)
        return {"PYTHONPATH": path, "PYTHONSAFEPATH": "1"}

    def write(self, run: RunDir) -> None:
        _write_json(run.launch_file, asdict(self))


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
    def __init__(self, run: RunDir, config: ShimConfig) -> None:
        self.run, self.config = run, config
        self.cancelled = False
        self.started = time.time()

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
        req = LaunchRequest(
            job_id=self.config.job_id,
            python=self.config.python,
            nproc_per_node=self.config.nproc_per_node,
            master_port=free_port(),
            run_dir=self.run.root,
            logs_dir=logs,
            program=ranktee.wrap(self.run, number, self.config.rank_program(self.run)),
            env=env,
        )
        record = {
            "number": number,
            "started_at": time.time(),
            "ended_at": None,
            "exit_code": None,
            "reason": None,
            "startup_failure": None,
        }
        _write_json(self.run.attempt_file(number), record)
        handle = LocalTorchrunLauncher().start(req, new_session=False)
        forced_reason: str | None = None
        while (code := handle.poll()) is None:
            forced_reason = self._why_stop(number)
            if forced_reason is not None:
                handle.terminate(self.config.stop_grace_s)
                code = handle.poll()
                break
            _wait_exit(handle, POLL_S)
        code = code if code is not None else -signal.SIGKILL
        ready = all(
            self.run.ready_marker(number, r).exists() for r in range(self.config.nproc_per_node)
        )
        if forced_reason is not None:
            reason = forced_reason  # torchrun may exit 0 on SIGTERM; the stop still failed it
        elif code == 0:
            reason = None
        else:
            reason = describe_exit(code, logs, logs / "torchrun.log")
        if code == 0:
            rank_codes = {str(r): 0 for r in range(self.config.nproc_per_node)}
        else:
            rank_codes = {
                str(r): c for r, c in failed_rank_exit_codes(logs / "torchrun.log").items()
            }
        record.update(
            ended_at=time.time(),
            exit_code=code,
            reason=reason,
            rank_exit_codes=rank_codes,
            startup_failure=(code != 0 and not ready and forced_reason is None),
        )
        _write_json(self.run.attempt_file(number), record)
        return code, reason, bool(record["startup_failure"])

    def _why_stop(self, number: int) -> str | None:
        if self.cancelled:
            return "cancelled"
        cfg = self.config
        if cfg.max_runtime_s is not None and time.time() - self.started > cfg.max_runtime_s:
            return DEADLINE_REASON
        if cfg.heartbeat_timeout_s is not None:
            now = time.time()
            for rank in range(cfg.nproc_per_node):
                marker = self.run.ready_marker(number, rank)
                try:
                    idle = now - marker.stat().st_mtime
                except FileNotFoundError:
                    continue  # still starting; start-up has its own failure path
                if idle > cfg.heartbeat_timeout_s:
                    return f"rank {rank} made no progress for {cfg.heartbeat_timeout_s:g} s"
        return None

    def main(self) -> int:
        number = 1
        while True:
            code, reason, startup = self.run_attempt(number)
            if self.cancelled:
                outcome = {"state": "cancelled", "exit_code": code, "reason": "cancelled by user"}
                break
            if code == 0 and reason is None:
                outcome = {"state": "succeeded", "exit_code": 0, "reason": None}
                break
            last = startup or number > self.config.max_restarts or reason == DEADLINE_REASON
            if last:
                if startup:
                    reason = f"start-up failure (not retried): {reason}"
                outcome = {"state": "failed", "exit_code": code, "reason": reason}
                break
            number += 1
        outcome.update(attempts=number, ended_at=time.time())
        _write_json(self.run.exit_file, outcome)
        return 0


def main() -> None:
    run = RunDir(Path(sys.argv[1]).resolve())
    shim = Shim(run, ShimConfig.read(run))
    signal.signal(signal.SIGTERM, shim.on_sigterm)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # the server's terminal going away is not a cancel
    sys.exit(shim.main())


if __name__ == "__main__":
    main()
