"""The GPUs of this host, asked of ``nvidia-smi`` (the server never imports torch)."""

import shutil
import subprocess


def detect_gpus() -> tuple[int, ...]:
    """GPU indices from ``nvidia-smi`` (no torch import in the server); () when there is none."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return ()
    try:
        out = subprocess.run(
            [exe, "--query-gpu=index", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(int(line) for line in out.split() if line.strip().isdigit())
