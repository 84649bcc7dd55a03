"""Chart series: the downsampler, the series and progress routes, and the dashboard's static files."""

import math
import random
import time

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import insert

from service.domain.records.downsample import build_lines, downsample_indices, epoch_mean
from service.store import records as recordstore
from service.store import repository as repo
from service.store.tables import MetricRecord
from torchyard_contract.spec import JobSpec

N = 100_000


def _noisy_loss(n: int, seed: int = 0) -> list[float]:
    rnd = random.Random(seed)
    return [2.0 / (1 + i / 1000) + rnd.gauss(0, 0.05) for i in range(n)]


def test_downsampling_100k_points_is_bounded_and_keeps_ends_and_extremes() -> None:
    ys = _noisy_loss(N)
    ys[31_337] = 50.0  # a spike
    ys[77_777] = -3.0  # a dip
    ys[90_000] = math.nan  # a diverged value
    started = time.perf_counter()
    keep = downsample_indices(ys, 1000)
    elapsed = time.perf_counter() - started
    assert len(keep) <= 1002 and len(keep) >= 500
    assert keep == sorted(set(keep))
    assert keep[0] == 0 and keep[-1] == N - 1
    assert {31_337, 77_777, 90_000} <= set(keep)
    finite = [i for i in range(N) if math.isfinite(ys[i])]
    assert max(finite, key=ys.__getitem__) in keep and min(finite, key=ys.__getitem__) in keep
    assert elapsed < 1.0, f"downsampling 100k points took {elapsed:.2f} s"


def test_short_series_are_returned_whole() -> None:
    assert downsample_indices([1.0, 2.0, 3.0], 16) == [0, 1, 2]
    assert downsample_indices([], 16) == []
    assert downsample_indices([float(i) for i in range(16)], 3) == list(range(16))
    assert len(downsample_indices([float(i) for i in range(17)], 16)) <= 18


def test_mean_across_ranks_uses_the_latest_attempt_where_attempts_overlap() -> None:
    # (attempt, rank, epoch, value): attempt 1 died after epoch 2, attempt 2 resumed at epoch 2
    points = [
        (1, 0, 1, 1.0), (1, 1, 1, 3.0), (1, 0, 2, 10.0), (1, 1, 2, 10.0),
        (2, 0, 2, 4.0), (2, 1, 2, 6.0), (2, 0, 3, math.nan), (2, 1, 3, 1.0),
    ]
    columns = [np.array(c) for c in zip(*reversed(points), strict=True)]  # any order will do
    xs, ys = epoch_mean(*columns)
    assert xs.tolist() == [1, 2, 3]
    assert ys[:2].tolist() == [2.0, 5.0] and math.isnan(ys[2])
    lines, mean = build_lines(*columns, max_points=100)
    assert [(line.rank, line.attempt) for line in lines] == [(0, 1), (0, 2), (1, 1), (1, 2)]
    assert lines[0].x == [1, 2] and lines[0].y == [1.0, 10.0]
    assert lines[1].x == [2, 3] and mean.points == 3


def _job_with_points(api: TestClient, points_per_rank: int, ranks: int = 2) -> int:
    """A stored job with ``points_per_rank`` per-epoch losses per rank (one an inf), written straight
    into the table in one executemany (the ingest path is tested elsewhere; this is the read path)."""
    factory = api.app.state.session_factory  # type: ignore[attr-defined]
    ys = _noisy_loss(points_per_rank)
    with factory() as session:
        job = repo.create_job(session, JobSpec(epochs=points_per_rank, nproc_per_node=ranks))
        rows = [
            {"job_id": job.id, "attempt": 1, "rank": r, "epoch": e + 1, "step": recordstore.EPOCH_STEP,
             "name": "loss", "value": ys[e] + r * 0.01, "nonfinite": None, "time": 0.0}
            for r in range(ranks) for e in range(points_per_rank)
        ]
        rows[points_per_rank // 3].update(value=None, nonfinite="Infinity")
        session.execute(insert(MetricRecord), rows)
        session.commit()
        return job.id


def test_series_route_downsamples_a_100k_point_job(api: TestClient) -> None:
    job_id = _job_with_points(api, N // 2)  # 2 ranks × 50k epochs = 100k points
    started = time.perf_counter()
    r = api.get(f"/jobs/{job_id}/series", params={"name": "loss", "max_points": 1000})
    elapsed = time.perf_counter() - started
    assert r.status_code == 200, r.text
    body = r.json()
    assert [(line["rank"], line["attempt"]) for line in body["lines"]] == [(0, 1), (1, 1)]
    for line in body["lines"]:
        assert line["points"] == N // 2
        assert len(line["x"]) == len(line["y"]) <= 1002
        assert line["x"][0] == 1 and line["x"][-1] == N // 2
    assert "Infinity" in body["lines"][0]["y"], "the non-finite extreme is kept, as the API spells it"
    assert body["mean"]["points"] == N // 2 and len(body["mean"]["x"]) <= 1002
    assert body["last_seq"] == N and body["names"] == ["loss"]
    assert body["attempts"] == [{"number": 1, "first_x": 1}]
    # How fast is bench/'s question (docs/benchmarks.md), not a timed test's: printed only.
    print(f"series of 100k points: {elapsed * 1000:.0f} ms, {len(r.content)} bytes")

    progress = api.get("/progress", params={"job_id": [job_id, 999]}).json()["items"]
    assert progress[0] == {"job_id": job_id, "last_seq": N, "epoch": N // 2}
    assert progress[1] == {"job_id": 999, "last_seq": 0, "epoch": None}


def test_series_route_rejects_bad_input_clearly(api: TestClient) -> None:
    assert api.get("/jobs/999/series").status_code == 404
    job_id = api.post("/jobs", json={"dataset": "synthetic"}).json()["id"]
    r = api.get(f"/jobs/{job_id}/series", params={"max_points": 3})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "max_points"
    r = api.get(f"/jobs/{job_id}/series", params={"level": "batch"})
    assert r.status_code == 422 and "level" in r.json()["message"]
    assert api.get("/progress").status_code == 422
    empty = api.get(f"/jobs/{job_id}/series").json()
    assert empty["lines"] == [] and empty["last_seq"] == 0 and empty["state"] == "queued"


def test_dashboard_shell_and_local_plotly_are_served(api: TestClient) -> None:
    index = api.get("/")
    assert index.status_code == 200 and "text/html" in index.headers["content-type"]
    assert "/static/app.js" in index.text
    assert "/static/plotly.min.js" in api.get("/static/app.js").text, "loaded by app.js"
    assert "http" not in index.text.replace("http-equiv", ""), "no external resources"
    plotly = api.get("/static/plotly.min.js")
    assert plotly.status_code == 200 and "javascript" in plotly.headers["content-type"]
    assert len(plotly.content) > 1_000_000 and b"plotly" in plotly.content[:2000].lower()
    for name, kind in (("app.js", "javascript"), ("style.css", "css")):
        r = api.get(f"/static/{name}")
        assert r.status_code == 200 and kind in r.headers["content-type"]
    missing = api.get("/static/secrets.txt")
    assert missing.status_code == 404 and "app.js" in missing.json()["message"]
    assert api.get("/static/..%2F..%2Fsettings.py").status_code == 404
