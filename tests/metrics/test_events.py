"""Event streams (resumed with Last-Event-ID) and per-rank logs read with an offset cursor."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
from fastapi.testclient import TestClient
from httpx_sse import connect_sse

from service.api.routes.logs import read_chunk
from service.executor.local import LocalExecutor
from tests.conftest import LiveServer, every_record, give_token, hooks
from torchyard_contract.rundir import RunDir

SPEC = {"name": "events", "dataset": "digits", "epochs": 4, "nproc_per_node": 2}
TERMINAL = {"succeeded", "failed", "cancelled"}


def _read_events(
    client: httpx.Client, job_id: int, last_id: str | None, stop_after_metrics: int | None
) -> list[tuple[str, str, dict]]:
    """Events of one connection; closes it after ``stop_after_metrics`` metric events."""
    headers = {"Last-Event-ID": last_id} if last_id else {}
    events = []
    with connect_sse(client, "GET", f"/jobs/{job_id}/events", headers=headers) as source:
        assert source.response.status_code == 200
        for sse in source.iter_sse():
            if sse.event == "message" and not sse.data:
                continue  # httpx-sse reports a keep-alive comment as an empty message
            events.append((sse.event, sse.id, sse.json()))
            metrics = sum(1 for e in events if e[0] == "metric")
            if stop_after_metrics is not None and metrics >= stop_after_metrics:
                break
    return events


def test_reconnect_with_last_event_id_gets_every_record_once(shared_server: LiveServer) -> None:
    server = shared_server
    with httpx.Client(base_url=server.url, timeout=60) as c:
        # A second per epoch keeps the job running while the first connection is dropped.
        job_id = c.post("/jobs", json={**SPEC, "labels": hooks(epoch_sleep_s=1)}).json()["id"]
        first = _read_events(c, job_id, None, stop_after_metrics=3)
        mid_job_state = c.get(f"/jobs/{job_id}").json()["state"]
        second = _read_events(c, job_id, first[-1][1], stop_after_metrics=None)
        stored = c.get(f"/jobs/{job_id}/metrics", params={"limit": 10_000}).json()["items"]

    assert mid_job_state not in TERMINAL, "the first connection must be dropped mid-job"
    events = first + second
    metric_seqs = [data["seq"] for kind, _, data in events if kind == "metric"]
    assert metric_seqs == [m["seq"] for m in stored], "every record exactly once, in seq order"
    assert [d for k, _, d in events if k == "metric"] == stored, "metric events carry the records"
    states = [data["state"] for kind, _, data in events if kind == "state"]
    assert states[0] in ("queued", "starting") and states[-1] == "succeeded"
    assert len(states) == len(set(states)), f"no state replayed: {states}"
    assert events[-1][0] == "state", "the terminal state comes after every record"
    ids = [event_id for _, event_id, _ in events]
    assert len(ids) == len(set(ids))

    # A reconnect after the end sends nothing and ends at once.
    with httpx.Client(base_url=server.url, timeout=30) as c:
        assert _read_events(c, job_id, events[-1][1], stop_after_metrics=None) == []

    # Logs, paged with a small limit, are exactly the files the rank wrote, and complete: by
    # default both streams in one file; with stream=, the one torchrun kept for that stream.
    run = RunDir.for_job(server.home / "runs", job_id)
    with httpx.Client(base_url=server.url, timeout=30) as c:
        for rank in (0, 1):
            read = {}
            for stream in ("combined", "stderr", "stdout"):
                text, offset = "", 0
                while True:
                    params = {"rank": rank, "offset": offset, "limit": 1000}
                    if stream != "combined":
                        params["stream"] = stream
                    chunk = c.get(f"/jobs/{job_id}/logs", params=params).json()
                    assert (chunk["rank"], chunk["attempt"], chunk["offset"]) == (rank, 1, offset)
                    assert chunk["stream"] == stream
                    text += chunk["text"]
                    offset = chunk["next_offset"]
                    if chunk["complete"]:
                        break
                path = LocalExecutor().rank_log(run, 1, rank, stream).path  # type: ignore[arg-type]
                assert path is not None
                assert text == path.read_bytes().decode("utf-8", errors="replace")
                read[stream] = text
            assert f"rank{rank} INFO" in read["stderr"]
            # The built-in trainer prints nothing: everything it wrote is its stderr, in order.
            assert read["stdout"] == "" and read["combined"] == read["stderr"]


def test_many_streams_of_one_job_each_get_every_record_once(shared_server: LiveServer) -> None:
    # Streams woken by the same commit share one read (service.api.hotreads): each must still
    # get the whole job, in order, on its own cursor.
    server = shared_server
    streams = 12
    with httpx.Client(base_url=server.url, timeout=60) as c:
        job_id = c.post("/jobs", json={**SPEC, "labels": hooks(epoch_sleep_s=0.3)}).json()["id"]

    def follow(_: int) -> list[tuple[str, str, dict]]:
        with httpx.Client(base_url=server.url, timeout=60) as client:
            return _read_events(client, job_id, None, stop_after_metrics=None)

    with ThreadPoolExecutor(max_workers=streams) as pool:
        seen = list(pool.map(follow, range(streams)))
    stored = every_record(server, job_id)
    assert len(stored) >= 8
    for events in seen:
        assert [d for k, _, d in events if k == "metric"] == stored
        assert events[-1][0] == "state" and events[-1][2]["state"] == "succeeded"


def test_event_and_log_errors(api: TestClient) -> None:
    assert api.get("/jobs/7/events").status_code == 404
    assert api.get("/jobs/7/logs").json()["message"] == "job 7 not found"
    job_id = api.post("/jobs", json=SPEC).json()["id"]
    r = api.get(f"/jobs/{job_id}/events", headers={"Last-Event-ID": "../etc"})
    assert r.status_code == 422 and "Last-Event-ID" in r.json()["message"]
    r = api.get(f"/jobs/{job_id}/logs", params={"rank": 2})
    assert r.status_code == 404 and r.json()["message"] == f"job {job_id} has ranks 0..1; no rank 2"
    r = api.get(f"/jobs/{job_id}/logs", params={"rank": 0, "attempt": 2})
    assert r.status_code == 404 and "no attempt 2" in r.json()["message"]
    r = api.get(f"/jobs/{job_id}/logs", params={"stream": "../x"})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "stream"
    for huge in (2**63 - 1, "1e20"):
        r = api.get(f"/jobs/{job_id}/logs", params={"offset": huge})
        assert r.status_code == 422 and r.json()["details"][0]["field"] == "offset"
    # Queued: nothing written yet, not complete (a follower keeps polling).
    chunk = api.get(f"/jobs/{job_id}/logs", params={"rank": 1}).json()
    assert chunk == {"rank": 1, "attempt": 1, "stream": "combined", "offset": 0,
                     "next_offset": 0, "text": "", "complete": False}


def test_log_chunks_never_split_a_character(tmp_path: Path) -> None:
    path = tmp_path / "stderr.log"
    path.write_bytes("é€x".encode() + b"\xff\n")  # 2 + 3 + 1 bytes, then an invalid byte
    text, nxt, at_end = read_chunk(path, 0, 4, final=False)
    assert (text, nxt, at_end) == ("é", 2, False)  # "€" is cut at byte 4: left for later
    text, nxt, at_end = read_chunk(path, nxt, 100, final=True)
    assert (text, nxt, at_end) == ("€x\ufffd\n", 8, True)


def test_a_finished_jobs_stream_resumes_from_any_event(api: TestClient) -> None:
    """Records of a finished job come before its terminal state (ids ``<seq>--1``); resuming
    from any of them gives the rest exactly once, then the terminal state."""
    job_id = api.post("/jobs", json=SPEC).json()["id"]
    auth = {"authorization": f"Bearer {give_token(api, job_id)}"}
    batch = [{"rank": r, "epoch": e, "name": "loss", "value": 1.0, "time": 1.0}
             for e in (1, 2) for r in (0, 1)]
    assert api.post(f"/jobs/{job_id}/records", json={"records": batch},
                    headers=auth).json()["accepted"] == 4
    api.post(f"/jobs/{job_id}/cancel")

    def events(last_id: str | None = None) -> list[tuple[str, str]]:
        headers = {"Last-Event-ID": last_id} if last_id else {}
        with connect_sse(api, "GET", f"/jobs/{job_id}/events", headers=headers) as source:
            assert source.response.status_code == 200, source.response.read()
            return [(e.event, e.id) for e in source.iter_sse()]

    first = events()
    assert [kind for kind, _ in first] == ["metric"] * 4 + ["state"]
    assert first[0][1].endswith("--1")
    for cut in range(len(first)):
        assert events(first[cut][1]) == first[cut + 1:], cut
