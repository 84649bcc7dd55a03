"""``torchyard serve --workers 2``: two API processes share the database; exactly one supervises.

50 concurrent submits and 4 concurrent record writers (two 2-rank jobs): every job and every
record exactly once, no slot ever held twice, one supervisor for the whole run.
"""

import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.conftest import LiveServer, assert_no_slot_held_twice, both_stores

pytestmark = [pytest.mark.slow, both_stores]
EPOCHS = 5


def test_two_api_processes_store_every_job_and_record_once_and_never_share_a_slot(
    live_server_factory,  # type: ignore[no-untyped-def]
) -> None:
    server: LiveServer = live_server_factory(
        _args=("--workers", "2"), TORCHYARD_CPU_SLOTS="4", TORCHYARD_TEST_EPOCH_SLEEP_S="0.3",
    )
    writer = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": EPOCHS,
              "nproc_per_node": 2, "priority": 10}
    filler = {"dataset": "synthetic", "synthetic_samples": 64, "epochs": 1, "nproc_per_node": 1}

    def post(i: int) -> httpx.Response:
        spec = writer if i < 2 else filler
        with server.client() as c:
            return c.post("/jobs", json={**spec, "name": f"burst-{i}"},
                          headers={"Idempotency-Key": f"burst-{i}"})

    with ThreadPoolExecutor(max_workers=25) as pool:
        responses = list(pool.map(post, range(50)))
    assert [r.status_code for r in responses] == [201] * 50, [r.text for r in responses[:3]]
    ids = [r.json()["id"] for r in responses]
    assert len(set(ids)) == 50
    writers, fillers = ids[:2], ids[2:]
    with server.client() as c:
        assert len(c.get("/jobs?limit=100").json()["items"]) == 50
        for job_id in fillers:
            c.post(f"/jobs/{job_id}/cancel")
        deadline = time.monotonic() + 240
        while True:
            assert c.get("/resources").json()["cpu"]["allocated"] <= 4
            states = {j: c.get(f"/jobs/{j}").json()["state"] for j in writers}
            if all(s in ("succeeded", "failed", "cancelled") for s in states.values()):
                break
            assert time.monotonic() < deadline, states
            time.sleep(0.2)
        finals = {j: c.get(f"/jobs/{j}").json() for j in ids}
    assert all(finals[j]["state"] == "succeeded" for j in writers), [finals[j] for j in writers]
    assert {finals[j]["state"] for j in fillers} <= {"cancelled", "succeeded"}
    assert_no_slot_held_twice(list(finals.values()))
    for job_id in writers:
        items, after = [], 0
        with server.client() as c:
            while page := c.get(f"/jobs/{job_id}/metrics",
                                params={"after": after}).json()["items"]:
                items += page
                after = page[-1]["seq"]
        keys = Counter((i["attempt"], i["rank"], i["epoch"], i["step"], i["name"]) for i in items)
        assert max(keys.values()) == 1
        assert {(i["rank"], i["epoch"]) for i in items if i["name"] == "loss"} == {
            (r, e) for r in (0, 1) for e in range(1, EPOCHS + 1)
        }
    log = server.log.read_text()
    assert log.count("supervises, generation") == 1, "more than one supervisor, or a failover"
    assert log.count("Started server process") == 2
