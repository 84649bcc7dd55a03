"""What every benchmark shares: result rows, percentiles, and a description of the machine."""

import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Row:
    """One measured figure. ``goal`` is the issue's target in words ('' when there is none)."""

    bench: str
    metric: str
    value: float | str
    unit: str
    goal: str = ""
    note: str = ""

    def as_dict(self) -> dict[str, object]:
        return asdict(self)


def run_baseline(argv: list[str], cwd: Path, env: Mapping[str, str]) -> tuple[float, float]:
    """Run a baseline (plain torchrun, plain python) to its end in ``cwd``, its output in
    ``cwd/baseline.log``; its start and end (``time.time()``). A plain rank now and then aborts at
    interpreter exit after gloo's teardown ("terminate called without an active exception",
    SIGABRT: 1 of 6 plain runs on a loaded 2-core host, and once in CI), which a torchyard rank
    never reaches (it ends through ``os._exit``, ``service.run.fastexit``); so a failed baseline
    runs once more, and a second failure raises with the log."""
    log = cwd / "baseline.log"

    def once() -> tuple[int, float, float]:
        started = time.time()
        with log.open("wb") as out:
            code = subprocess.run(argv, cwd=cwd, env=dict(env), stdout=out,
                                  stderr=subprocess.STDOUT).returncode
        return code, started, time.time()

    code, started, ended = once()
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        print(f"bench: baseline exited {code}; once more. Its log:\n{tail}", file=sys.stderr)
        code, started, ended = once()
    if code != 0:
        tail = log.read_text(errors="replace")[-3000:]
        raise RuntimeError(f"baseline {argv[1:4]} exited {code} twice:\n{tail}")
    return started, ended


def percentile(values: list[float], q: float) -> float:
    """The ``q``-th percentile (0..100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    cuts = statistics.quantiles(values, n=1000, method="inclusive")
    return cuts[min(len(cuts) - 1, max(0, round(q * 10) - 1))]


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def memory_gib() -> float:
    import psutil

    return psutil.virtual_memory().total / 2**30


def machine() -> dict[str, object]:
    """The facts a reader needs to compare absolute figures: cores, CPU, memory, versions, load."""
    import importlib.metadata as md

    def version(dist: str) -> str:
        try:
            return md.version(dist)
        except md.PackageNotFoundError:
            return "missing"

    return {
        "nproc": os.cpu_count(),
        "cpu": cpu_model(),
        "memory_gib": round(memory_gib(), 1),
        "python": sys.version.split()[0],
        "torch": version("torch"),
        "fastapi": version("fastapi"),
        "uvicorn": version("uvicorn"),
        "sqlalchemy": version("sqlalchemy"),
        "sqlite": __import__("sqlite3").sqlite_version,
        "loadavg": [round(x, 2) for x in os.getloadavg()],
    }


def fmt(value: float | str) -> str:
    if isinstance(value, str):
        return value
    if math.isnan(value):
        return "n/a"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"
