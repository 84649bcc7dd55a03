"""Layout of a job's run directory: the files the server, the job's attempt loop and its ranks share.

Part of the contract (``torchyard_contract``). A rank finds the directory in
``TORCHYARD_RUN_DIR`` and builds the same ``RunDir`` from it: no path is spelled twice.
"""

from dataclasses import dataclass
from pathlib import Path

from torchyard_contract import runwrite


@dataclass(frozen=True)
class RunDir:
    root: Path

    @classmethod
    def for_job(cls, runs_dir: Path, job_id: int) -> "RunDir":
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
        """The attempt loop's configuration (no secrets)."""
        return self.root / "launch.json"

    @property
    def attempt_loop_log(self) -> Path:
        """The attempt loop's own output (stdout and stderr): what it did between attempts, why
        a warm start was not possible, why it refused to run. Not served by the API (a rank's
        log is: ``rank_output``); its name before 0.2.0 is in CHANGELOG.md."""
        return self.root / "attempt-loop.log"

    @property
    def claim_file(self) -> Path:
        """Who owns this launch, created once (``torchyard_contract.claim``): the job's attempt loop as
        it starts (pid, start time, host), or a recovering server that gave the launch up."""
        return self.root / "claim.json"

    @property
    def exit_file(self) -> Path:
        """The job's outcome, written once by the attempt loop."""
        return self.root / "exit.json"

    @property
    def pause_request(self) -> Path:
        """Written by the supervisor to pause the running launch (its content: why); the attempt
        loop and ``worker.should_stop()`` look for it. Removed when the job is launched again."""
        return self.root / "pause.json"

    @property
    def spool_dir(self) -> Path:
        return self.root / "spool"

    def spool_file(self, rank: int) -> Path:
        """A rank's records, one JSON line each (``torchyard_contract.records``)."""
        return self.spool_dir / f"rank-{rank}.jsonl"

    def spool_ack_file(self, rank: int) -> Path:
        """The byte offset in the rank's spool file up to which the API answered every record
        (ASCII digits; the rank's reporter replaces it after each batch). The server re-reads
        the spool from there when the job ends."""
        return self.spool_dir / f"rank-{rank}.ack"

    @property
    def checkpoints_dir(self) -> Path:
        """Epoch checkpoints (``worker.checkpoint``); a ``resume_from`` job reads another's."""
        return self.root / "checkpoints"

    @property
    def work_dir(self) -> Path:
        """A package job's own copy of its package: the ranks' working directory."""
        return self.root / "work"

    @property
    def output_dir(self) -> Path:
        """``TORCHYARD_OUTPUT_DIR``: what the job keeps (GET /jobs/{id}/artifacts)."""
        return self.root / "outputs"

    @property
    def tensorboard_dir(self) -> Path:
        """TensorBoard event files the server writes from the stored records
        (``service.domain.tracking``); served as ``artifacts/tensorboard/...``."""
        return self.root / "tensorboard"

    @property
    def attempts_dir(self) -> Path:
        return self.root / "attempts"

    def attempt_file(self, attempt: int) -> Path:
        return self.attempts_dir / f"{attempt}.json"

    def ready_marker(self, attempt: int, rank: int) -> Path:
        """Written by a rank after set-up, then touched as its heartbeat."""
        return self.attempts_dir / str(attempt) / f"ready-rank-{rank}"

    def rank_output(self, attempt: int, rank: int) -> Path:
        """Everything ``rank`` printed in ``attempt``, both streams in the order written
        (``service.run.ranktee``); torchrun keeps each stream apart under ``attempt-<n>/`` too."""
        return self.logs_dir / f"attempt-{int(attempt)}" / f"rank-{int(rank)}.log"

    def node_name_file(self, attempt: int, node_index: int) -> Path:
        """Slurm: the name of node ``node_index`` of ``attempt``'s allocation, written there by
        that node's torchrun wrapper (``service.run.srun``; ``torchyard_contract.nodes``)."""
        return self.logs_dir / f"attempt-{int(attempt)}" / f"node-{int(node_index)}" / "node"

    @property
    def stacks_dir(self) -> Path:
        """Ranks' stacks the attempt loop took (``service.run.stackdump``): at a hang, on request."""
        return self.root / "stacks"

    @property
    def flight_recorder_prefix(self) -> Path:
        """``TORCH_NCCL_DEBUG_INFO_TEMP_FILE``: NCCL's Flight Recorder dumps, the rank appended."""
        return self.stacks_dir / "flight-recorder" / "rank_"

    def prepare(self) -> None:
        """Ready for a launch: a resumed job's run directory loses its last launch's outcome,
        claim and pause request (its attempts, spools and checkpoints stay). Below the root,
        confined (``torchyard_contract.runwrite``): the directory may be the job's user's."""
        self.root.mkdir(parents=True, exist_ok=True)
        runwrite.make_dir(self.logs_dir)
        for stale in (self.error_file, self.exit_file, self.claim_file, self.pause_request):
            runwrite.remove(stale)
