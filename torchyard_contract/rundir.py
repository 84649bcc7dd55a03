"""Layout of a job's run directory: the files the supervisor and the ranks share."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def for_job(cls, runs_dir: Path, job_id: int) -> RunDir:
        return cls((runs_dir / str(job_id)).resolve())

    @property
    def spec_file(self) -> Path:
        return self.root / "spec.json"

    @property
    def logs_dir(self) -> Path:
        return self.root / "logs"

    @property
    def error_file(self) -> Path:
        """TORCHELASTIC_ERROR_FILE: the first failing rank's exception, written by ``@record``."""
        return self.root / "error.json"

    @property
    def launch_file(self) -> Path:
        """The shim's configuration (no secrets)."""
        return self.root / "launch.json"

    @property
    def exit_file(self) -> Path:
        """The job's outcome, written once by the shim."""
        return self.root / "exit.json"

    @property
    def spool_dir(self) -> Path:
        return self.root / "spool"

    def attempt_file(self, attempt: int) -> Path:
        return self.root / "attempts" / f"{attempt}.json"

    def ready_marker(self, attempt: int, rank: int) -> Path:
        """Written by a rank after set-up, then touched as its heartbeat."""
        return self.root / "attempts" / str(attempt) / f"ready-rank-{rank}"

    def rank_logs(self) -> dict[int, Path]:
        """Per-rank combined stdout/stderr files torchrun wrote under ``logs/``."""
        found: dict[int, Path] = {}
        for path in sorted(self.logs_dir.glob("**/attempt_*/*/stderr.log")):
            found[int(path.parent.name)] = path
        return found

    def prepare(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(exist_ok=True)
        for stale in (self.error_file, self.exit_file):
            stale.unlink(missing_ok=True)
