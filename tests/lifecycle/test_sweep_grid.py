"""Grid sweeps are never materialised (issue 44, item 1): a grid's points are computed from their
index, its size is bounded when the sweep is created (422 naming the size and the bound), and a
sweep whose study cannot be built fails itself, never the supervisor."""

import time
from itertools import product

import psutil
import pytest
from sqlalchemy import create_engine
from sqlalchemy.orm import Session

from service.domain.sweeps.grid import GRID_POINTS_MAX, grid_point, grid_size
from service.domain.sweeps.spec import SweepSpec
from service.store import sweeps as sweepstore
from tests.conftest import LiveServer, add_script

BUILTIN = {"dataset": "digits", "model": "mlp", "epochs": 1, "batch_size": 256, "device": "cpu",
           "checkpoint_every": 0}
SCRIPT = {"entrypoint": "grid_trial.py", "device": "cpu"}
GRID_TRIAL = """\
import sys

import worker

worker.report(epoch=1, loss=float(sys.argv[1].removeprefix("--x=")))
"""
CHOICES_256 = {"type": "choice", "values": list(range(256))}
INT_31 = {"type": "int", "low": -(2**31), "high": 2**31}
# Server memory a few refused requests may add, at most (the 10^7-point int grid took it to
# 986 MiB when its range was expanded during validation).
RSS_GROWTH_MAX = 100 * 2**20


def _grid(space: dict, **extra: object) -> SweepSpec:
    return SweepSpec.model_validate({"spec": SCRIPT, "method": "grid", "space": space, **extra})


def test_a_grid_point_is_computed_from_its_index_without_the_product() -> None:
    """A grid of 256^31 × (2^32 + 1) points: its size, first, last and any point by mixed radix
    (names sorted, the last varying fastest). Building the product would never end."""
    space = {f"p{i:02d}": CHOICES_256 for i in range(31)} | {"z": INT_31}
    spec = _grid(space)
    size = grid_size(spec.space)
    assert size == 256**31 * (2**32 + 1)
    assert grid_point(spec.space, 0) == {**{f"p{i:02d}": 0 for i in range(31)}, "z": -(2**31)}
    assert grid_point(spec.space, size - 1) == {**{f"p{i:02d}": 255 for i in range(31)},
                                                "z": 2**31}
    index = (3 * 256 + 7) * (2**32 + 1) + 5  # p29 = 3, p30 = 7, z = low + 5, the others 0
    assert grid_point(spec.space, index) == {**{f"p{i:02d}": 0 for i in range(29)}, "p29": 3,
                                             "p30": 7, "z": -(2**31) + 5}
    assert spec.grid_params(10**60).keys() == space.keys()  # any trial's point, at once


@pytest.mark.parametrize("sizes", [(1,), (2,), (7,), (3, 4), (4, 4, 4), (97,), (2, 3, 5, 7)])
def test_the_trials_visit_every_point_of_a_grid_once(sizes: tuple[int, ...]) -> None:
    """The k-th trial's point is a permutation of the grid: every point once, the same for the
    same seed, another order for another seed; an int dimension with a step counts by it."""
    space = {f"d{i}": {"type": "choice", "values": [f"v{j}" for j in range(n)]}
             for i, n in enumerate(sizes[:-1])}
    space["last"] = {"type": "int", "low": -3, "high": -3 + 2 * (sizes[-1] - 1), "step": 2}
    spec = _grid(space, seed=11)
    size = grid_size(spec.space)
    visited = [tuple(spec.grid_params(k).values()) for k in range(size)]
    every = set(product(*([f"v{j}" for j in range(n)] for n in sizes[:-1]),
                        range(-3, -3 + 2 * sizes[-1], 2)))
    assert len(visited) == size and set(visited) == every
    assert visited == [tuple(spec.grid_params(k).values()) for k in range(size)]
    if size > 6:
        other = _grid(space, seed=12)
        assert [tuple(other.grid_params(k).values()) for k in range(size)] != visited


def test_an_int_range_is_never_expanded() -> None:
    """±2^31 in a random sweep, and as a grid dimension: validated by arithmetic."""
    spec = SweepSpec.model_validate({"spec": SCRIPT, "space": {"x": INT_31}, "max_trials": 3})
    assert spec.grid_refused() is None  # not a grid
    grid = _grid({"x": INT_31})
    assert grid_size(grid.space) == 2**32 + 1
    assert grid.grid_refused() == (
        f"space: the grid has {2**32 + 1:,} points, more than the {GRID_POINTS_MAX:,} a grid "
        "sweep may have; use method 'random' (or 'tpe') with max_trials to sample a large space")
    assert _grid({"x": {**INT_31, "step": 2**32}}).grid_refused() is None  # two points


@pytest.fixture
def server(shared_script_server: LiveServer) -> LiveServer:
    """The session's shared script server: a script's parameters take any grid."""
    add_script(shared_script_server, "grid_trial.py", GRID_TRIAL)
    return shared_script_server


@pytest.mark.parametrize(("space", "points"), [
    ({"x": {"type": "int", "low": 0, "high": 10**7 - 1}}, 10**7),
    ({f"p{i:02d}": CHOICES_256 for i in range(32)}, 256**32),  # the most a space may have
    ({"a": CHOICES_256, "b": CHOICES_256, "c": {"type": "int", "low": 1, "high": 2}},
     GRID_POINTS_MAX + 31_072),
], ids=["int-10^7", "32-choices-of-256", "just-over"])
def test_a_grid_over_the_bound_is_422_naming_its_size_and_the_bound(
    server: LiveServer, space: dict, points: int
) -> None:
    """Refused at once, whatever the size, and the server's memory does not grow with it."""
    rss = psutil.Process(server.proc.pid).memory_info().rss
    with server.client() as c:
        r = c.post("/sweeps", json={"spec": SCRIPT, "method": "grid", "space": space})
        assert c.get("/healthz").status_code == 200
    assert r.status_code == 422, r.text
    [detail] = r.json()["details"]
    assert detail["field"] == "space", r.json()
    assert f"the grid has {points:,} points" in detail["message"]
    assert f"more than the {GRID_POINTS_MAX:,}" in detail["message"]
    assert psutil.Process(server.proc.pid).memory_info().rss - rss < RSS_GROWTH_MAX


def test_a_grid_at_the_bound_runs_its_points(server: LiveServer) -> None:
    """100,000 points of one int dimension: accepted; its trials get distinct points of it."""
    with server.client() as c:
        r = c.post("/sweeps", json={
            "spec": {**SCRIPT, "args": ["--x={x}"]}, "method": "grid", "max_trials": 2,
            "parallel": 2, "space": {"x": {"type": "int", "low": 1, "high": GRID_POINTS_MAX}}})
        assert r.status_code == 201, r.text
        sweep_id = r.json()["id"]
        deadline = time.monotonic() + 120
        while (sweep := c.get(f"/sweeps/{sweep_id}").json())["state"] == "running":
            assert time.monotonic() < deadline, f"the sweep did not end: {sweep}"
            time.sleep(0.3)
    assert sweep["state"] == "succeeded", sweep
    xs = [t["params"]["x"] for t in sweep["trials"]]
    assert len(set(xs)) == 2 and all(1 <= x <= GRID_POINTS_MAX for x in xs), xs
    assert sorted(t["value"] for t in sweep["trials"]) == sorted(float(x) for x in xs)


def test_a_stored_sweep_whose_study_cannot_be_built_fails_itself(
    shared_server: LiveServer,
) -> None:
    """A grid over the bound, stored as a server before the bound stored it (a running sweep):
    the supervisor fails the sweep with the size and the bound, makes no trial, and goes on."""
    server = shared_server
    values = {"type": "choice", "values": list(range(64))}
    request = SweepSpec.model_validate({
        "name": "legacy", "spec": BUILTIN, "method": "grid",
        "space": {"batch_size": {"type": "choice", "values": list(range(1, 65))},
                  "seed": values, "epochs": {"type": "choice", "values": list(range(1, 65))}},
    })
    engine = create_engine(f"sqlite:///{server.home / 'torchyard.db'}")
    try:
        with Session(engine) as session:
            sweep = sweepstore.create_sweep(session, "legacy", 0, request.model_dump(mode="json"))
            session.commit()
            sweep_id = sweep.id
    finally:
        engine.dispose()
    with server.client() as c:
        deadline = time.monotonic() + 30
        while (sweep := c.get(f"/sweeps/{sweep_id}").json())["state"] == "running":
            assert time.monotonic() < deadline, f"the sweep still runs: {sweep}"
            time.sleep(0.2)
        try:
            assert sweep["state"] == "failed", sweep
            assert sweep["reason"] == (
                f"its study could not be rebuilt: space: the grid has {64**3:,} points, more "
                f"than the {GRID_POINTS_MAX:,} a grid sweep may have; use method 'random' (or "
                "'tpe') with max_trials to sample a large space")
            assert sweep["trials"] == [] and sweep["best"] is None
            job = c.post("/jobs", json={"dataset": "synthetic", "epochs": 1}).json()
        finally:
            c.post(f"/sweeps/{sweep_id}/cancel")
    server.wait_for(job["id"], {"succeeded"})  # the supervisor goes on
