"""Cross-rank summary: the divergence rule (pure) and a real job whose rank 1 diverges."""

import math
import statistics

import pytest
from fastapi.testclient import TestClient

from service.domain.records.summary import EpochValue, diverged_ranks, summarize
from tests.conftest import REPO_ROOT, LiveServer, add_script

NAN, INF = math.nan, math.inf


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({0: 1.0, 1: 1.1, 2: 0.95, 3: 1.05}, []),  # ordinary spread between shards
        ({0: 1.0, 1: 10.0, 2: 1.1, 3: 0.9}, [1]),  # one outlier among four
        ({0: 1.0, 1: 10.0}, [1]),  # two ranks: the larger value is flagged
        ({0: 10.0, 1: 1.0}, [0]),
        ({0: 1.0, 1: 1.4}, []),  # within 50 % of the reference
        ({0: 1.0, 1: NAN, 2: 1.0}, [1]),  # non-finite while others are finite
        ({0: INF, 1: -INF}, []),  # all non-finite: nothing to compare with
        ({0: 3.0}, []),  # one rank alone
        ({0: 0.0, 1: 0.0}, []),  # zero reference
        ({0: 0.0, 1: 0.5}, [1]),
    ],
)
def test_divergence_rule(values: dict[int, float], expected: list[int]) -> None:
    assert diverged_ranks(values, threshold=0.5) == expected


def test_summarize_takes_each_epoch_from_its_latest_attempt() -> None:
    values = [
        EpochValue(1, 0, 1, 2.0), EpochValue(1, 1, 1, 2.2),
        EpochValue(1, 0, 2, 1.5), EpochValue(1, 1, 2, NAN),  # attempt 1 died in epoch 2
        EpochValue(2, 0, 2, 1.4), EpochValue(2, 1, 2, 1.6),  # attempt 2 redid epoch 2
    ]
    first, second = summarize(values, threshold=0.5)
    assert (first.epoch, first.attempt, first.count) == (1, 1, 2)
    assert first.mean == pytest.approx(2.1) and first.std == pytest.approx(0.1)
    assert (first.min, first.max, first.diverged_ranks) == (2.0, 2.2, [])
    assert (second.epoch, second.attempt, second.ranks) == (2, 2, {0: 1.4, 1: 1.6})


def test_statistics_ignore_non_finite_values() -> None:
    (item,) = summarize([EpochValue(1, 0, 1, 1.0), EpochValue(1, 1, 1, INF)], 0.5)
    assert (item.count, item.mean, item.min, item.max, item.std) == (2, 1.0, 1.0, 1.0, 0.0)
    assert item.diverged_ranks == [1]


def test_summary_errors(api: TestClient) -> None:
    r = api.get("/jobs/999/metrics/summary")
    assert r.status_code == 404 and r.json()["message"] == "job 999 not found"
    job_id = api.post("/jobs", json={"dataset": "synthetic"}).json()["id"]
    r = api.get(f"/jobs/{job_id}/metrics/summary", params={"threshold": 0})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "threshold"


def test_diverging_rank_is_flagged(shared_script_server: LiveServer) -> None:
    """A script job whose rank 1 reports ten times rank 0's loss: flagged every epoch."""
    server = shared_script_server
    add_script(server, "losses.py", (REPO_ROOT / "tests" / "jobs" / "losses.py").read_text())
    spec = {"name": "diverge", "entrypoint": "losses.py", "args": ["1.5,0.75;15,7.5", "0"],
            "nproc_per_node": 2}
    with server.client() as c:
        # The server is shared: its ingest counter holds other tests' records too.
        ingested = _ingested(c.get("/metrics").text)
        job_id = c.post("/jobs", json=spec).json()["id"]
        server.wait_for(job_id, {"succeeded"})
        summary = c.get(f"/jobs/{job_id}/metrics/summary", params={"name": "loss"}).json()
        records = c.get(f"/jobs/{job_id}/metrics", params={"name": "loss"}).json()["items"]
        accuracy = c.get(f"/jobs/{job_id}/metrics/summary", params={"name": "samples"}).json()
        stored = len(c.get(f"/jobs/{job_id}/metrics").json()["items"])
        exposition = c.get("/metrics").text
    assert (summary["job_id"], summary["name"], summary["threshold"]) == (job_id, "loss", 0.5)
    assert [i["epoch"] for i in summary["items"]] == [1, 2]
    for item in summary["items"]:
        losses = {str(r["rank"]): r["value"] for r in records if r["epoch"] == item["epoch"]}
        assert item["ranks"] == losses and item["count"] == 2
        assert item["mean"] == pytest.approx(statistics.fmean(losses.values()))
        assert item["std"] == pytest.approx(statistics.pstdev(losses.values()))
        assert (item["min"], item["max"]) == (min(losses.values()), max(losses.values()))
        assert item["diverged_ranks"] == [1]
    # Where the ranks agree, nothing is flagged.
    assert [i["diverged_ranks"] for i in accuracy["items"]] == [[], []]
    assert _ingested(exposition) == ingested + stored


def _ingested(exposition: str) -> float:
    """``torchyard_metric_records_ingested_total`` of a scrape (0 before any record)."""
    name = "torchyard_metric_records_ingested_total "
    lines = [line for line in exposition.splitlines() if line.startswith(name)]
    return float(lines[0].removeprefix(name)) if lines else 0.0
