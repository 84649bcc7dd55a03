"""The worker's view of its environment: the only place that reads ``os.environ``.

Contract: :meth:`WorkerEnv.from_environ` takes a mapping (normally ``os.environ``) and
returns a frozen :class:`WorkerEnv`. Torchrun variables default to a single-process run
so the worker also works when started by hand. Malformed numbers raise ``ValueError``
naming the variable. The variable names are the contract's (``torchyard_contract.envnames``).
This module must stay free of torch imports (the reporter uses it).
"""

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from torchyard_contract import envnames as names


def _int(environ: Mapping[str, str], name: str, default: int | None) -> int | None:
    raw = environ.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


def _choice(environ: Mapping[str, str], name: str, allowed: tuple[str, ...]) -> str | None:
    raw = environ.get(name, "").strip().lower()
    if not raw:
        return None
    if raw not in allowed:
        raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {raw!r}")
    return raw


def _params(environ: Mapping[str, str]) -> dict:
    raw = environ.get(names.PARAMS)
    if not raw:
        return {}
    value = json.loads(raw)
    if not isinstance(value, dict):
        raise ValueError(f"{names.PARAMS}: must be a JSON object, got {raw[:100]!r}")
    return value


def _str(environ: Mapping[str, str], name: str) -> str | None:
    raw = environ.get(name, "").strip()
    return raw or None


@dataclass(frozen=True)
class WorkerEnv:
    """Everything a rank learns from its environment.

    ``device``/``backend`` are ``None`` when the supervisor did not resolve them (running
    outside torchyard); the trainer then picks cuda/nccl if CUDA is available, else
    cpu/gloo. ``api_url``/``job_id`` being ``None`` puts the reporter in no-op mode.
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int = 1
    master_addr: str | None = None
    master_port: int | None = None
    api_url: str | None = None
    job_id: int | None = None
    job_token: str | None = None
    run_dir: Path | None = None
    attempt: int = 1
    resume_dir: Path | None = None  # TORCHYARD_RESUME_DIR: checkpoints of the job named by resume_from
    device: str | None = None
    backend: str | None = None
    # TORCHYARD_PARAMS: a sweep trial's parameters (name → value); empty for other jobs.
    params: dict = field(default_factory=dict)
    output_dir: Path | None = None  # TORCHYARD_OUTPUT_DIR: what the job keeps (artifacts)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> "WorkerEnv":
        """Parse ``environ``; raises ``ValueError`` on malformed values."""
        run_dir = _str(environ, names.RUN_DIR)
        api_url = _str(environ, names.API_URL)
        return cls(
            rank=_int(environ, "RANK", 0) or 0,
            local_rank=_int(environ, "LOCAL_RANK", 0) or 0,
            world_size=_int(environ, "WORLD_SIZE", 1) or 1,
            master_addr=_str(environ, "MASTER_ADDR"),
            master_port=_int(environ, "MASTER_PORT", None),
            api_url=api_url.rstrip("/") if api_url else None,
            job_id=_int(environ, names.JOB_ID, None),
            job_token=_str(environ, names.JOB_TOKEN),
            run_dir=Path(run_dir) if run_dir else None,
            attempt=_int(environ, names.ATTEMPT, 1) or 1,
            resume_dir=Path(p) if (p := _str(environ, names.RESUME_DIR)) else None,
            device=_choice(environ, names.DEVICE, ("cpu", "cuda")),
            backend=_choice(environ, names.BACKEND, ("gloo", "nccl")),
            params=_params(environ),
            output_dir=Path(p) if (p := _str(environ, names.OUTPUT_DIR)) else None,
        )

    @classmethod
    def current(cls) -> "WorkerEnv":
        """``from_environ(os.environ)``: the one place the process environment is read."""
        return cls.from_environ(os.environ)

    @property
    def reporting_enabled(self) -> bool:
        """True when there is an API to send records to."""
        return self.api_url is not None and self.job_id is not None
