"""Smaller findings of issue 17 (finding 9): IPv6 worker URLs, log tails, metric names."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

from service import repository as repo
from service.settings import Settings
from torchyard_contract.rundir import RunDir


def test_ranks_get_a_bracketed_url_for_an_ipv6_host(tmp_path: Path) -> None:
    def url(**kw: object) -> str:
        return Settings(home=tmp_path, gpus="none", cpu_slots=1, **kw).api_url_for_workers()

    assert url(host="::1", port=8123) == "http://[::1]:8123"
    assert url(host="fe80::1%eth0", port=1) == "http://[fe80::1%eth0]:1"
    assert url(host="::", port=8000) == "http://127.0.0.1:8000"
    assert url(host="0.0.0.0", port=8000) == "http://127.0.0.1:8000"
    assert url(host="127.0.0.1", port=9) == "http://127.0.0.1:9"
    assert url(host="gpu-box.lan", port=9) == "http://gpu-box.lan:9"
    assert url(host="::1", public_url="http://[::1]:1/") == "http://[::1]:1"


def test_logs_can_start_at_the_tail_on_a_character_boundary(api: TestClient) -> None:
    job_id = api.post("/jobs", json={"name": "t", "dataset": "digits", "epochs": 1,
                                     "nproc_per_node": 1}).json()["id"]
    with api.app.state.session_factory() as session:
        repo.set_attempts(session, job_id, [{"number": 1, "started_at": 1.0, "ended_at": 2.0,
                                             "exit_code": 0, "reason": None,
                                             "startup_failure": False}])
        session.commit()
    runs = api.app.state.settings.runs_dir
    folder = RunDir.for_job(runs, job_id).logs_dir / "attempt-1/run/attempt_0/0"
    folder.mkdir(parents=True)
    data = ("é" * 1000 + "END\n").encode()  # 2-byte characters: most offsets split one
    (folder / "stderr.log").write_bytes(data)

    tail = api.get(f"/jobs/{job_id}/logs", params={"tail": 11}).json()
    assert tail["text"] == "éééEND\n" and tail["offset"] == len(data) - 10
    assert tail["next_offset"] == len(data)
    whole = api.get(f"/jobs/{job_id}/logs", params={"tail": 1024 * 1024}).json()
    assert whole["offset"] == 0 and whole["text"] == data.decode()
    mid = api.get(f"/jobs/{job_id}/logs", params={"offset": 5, "limit": 4}).json()
    assert mid["offset"] == 6 and mid["text"] == "éé", "an offset inside a character moves on"
    both = api.get(f"/jobs/{job_id}/logs", params={"tail": 10, "offset": 3})
    assert both.status_code == 422 and "tail" in both.json()["message"]
