"""The one rule for which process-group backend follows from a rank's device.

Used by the server when it places a job (``service.domain.queue.placement``) and by a rank that picks
its own device (``worker.train``: a Slurm job whose spec left the device to the node).
"""


def backend_for(device: str, requested: str | None = None) -> str:
    """NCCL on ``cuda`` unless ``requested`` is ``gloo``; gloo on ``cpu`` (NCCL cannot run there,
    whatever was requested)."""
    if device == "cuda":
        return "gloo" if requested == "gloo" else "nccl"
    return "gloo"
