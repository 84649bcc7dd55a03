"""Every benchmark runs end to end at smoke sizes and yields its result rows (no timing asserts)."""

import json
import math
from pathlib import Path

import pytest

from bench.__main__ import BENCHES, main

# The headline row each benchmark must produce (its figures are for docs/benchmarks.md).
HEADLINE = {
    "startup": "torchyard warm: POST -> first statement (median)",
    "endpath": "2 rank(s), torchyard default (warm): POST -> client sees succeeded (median)",
    "orchestration": "wall ratio job / plain",
    "trainer": "mlp: ratio built-in / seed",
    "ingest": "records/s",
    "polling": "concurrent: errors",
    "scheduling": "one scheduling pass (supervisor)",
    "fairshare": "policy (standing + plan), CPU: teams / no teams (median of pairs)",
    "slurm": "local: submit → first metric (server)",
    "stores": "sqlite, 1 API process: ratio to the bare loop",
    "stacks": "2 ranks on demand: wall (median)",  # 8 in the full run
    "pause": "pause → slots free (p50)",
    "idle": "what one idle server takes",
    "procstart": "warm preload: CPU, as served / plain imports",
    "dashboard": "big job list: first page drawn",
    "tracking": "stored → in MLflow p99",
}


@pytest.mark.bench
@pytest.mark.parametrize("name", BENCHES)
def test_bench_runs_in_smoke_mode(name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The suite turns warm ranks on for its own servers; a bench names what it compares.
    monkeypatch.setenv("TORCHYARD_WARM_RANKS", "false")
    out = tmp_path / "rows.json"
    results = main([name, "--smoke", "--json", str(out)])
    rows = results[name]
    assert rows and all(r.bench == name for r in rows)
    metrics = {r.metric: r.value for r in rows}
    assert HEADLINE[name] in metrics
    numbers = [v for v in metrics.values() if isinstance(v, float | int)]
    assert numbers and not any(math.isnan(v) for v in numbers), metrics  # every phase measured
    saved = json.loads(out.read_text())
    assert saved["smoke"] is True and len(saved["rows"]) == len(rows)
    assert saved["machine_before"]["nproc"] >= 1
