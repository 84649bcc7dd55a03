"""``GET /metrics``: Prometheus text with job, queue, resource and request series."""

from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

SPEC = {"name": "prom", "dataset": "digits", "epochs": 1, "nproc_per_node": 2}


def scrape(client: TestClient) -> dict[tuple[str, frozenset], float]:
    """``(sample name, labels) → value`` of one scrape."""
    r = client.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(r.text)
        for s in family.samples
    }


def test_jobs_queue_resources_and_request_latency(api: TestClient) -> None:
    before = scrape(api)
    assert before[("torchyard_jobs", frozenset({("state", "queued")}))] == 0
    assert before[("torchyard_resources", frozenset({("kind", "cpu")}))] == 4
    assert before[("torchyard_resources", frozenset({("kind", "gpu")}))] == 0
    assert before[("torchyard_resources_allocated", frozenset({("kind", "cpu")}))] == 0
    assert before[("torchyard_metric_records_ingested_total", frozenset())] == 0

    job_id = api.post("/jobs", json=SPEC).json()["id"]  # the supervisor loop is off: it stays queued
    api.get(f"/jobs/{job_id}")
    api.get(f"/jobs/{job_id + 1}")
    api.get("/no/such/path")
    after = scrape(api)
    assert after[("torchyard_jobs", frozenset({("state", "queued")}))] == 1
    assert after[("torchyard_queue_length", frozenset())] == 1

    def requests(route: str, method: str, status: str) -> float:
        labels = frozenset({("route", route), ("method", method), ("status", status)})
        return after[("torchyard_http_request_duration_seconds_count", labels)]

    assert requests("/jobs", "POST", "201") == 1
    assert requests("/jobs/{job_id}", "GET", "200") == 1
    assert requests("/jobs/{job_id}", "GET", "404") == 1
    assert requests("unmatched", "GET", "404") == 1
