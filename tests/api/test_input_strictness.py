"""Input the schema refuses is refused, not coerced; odd but harmless requests are not errors.

(Issue 17, finding 9: strict spec numbers, printable label values, huge log offsets, HEAD on the
public pages, query strings on the dashboard.)
"""

import json
import math

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from service.api.recordschemas import RecordBatch, parse_record_batch
from service.api.routes.logs import LOG_OFFSET_MAX
from service.client.specfile import load_spec_file, yaml_value
from torchyard_contract.rundir import RunDir


def _submit(api: TestClient, **spec: object):  # type: ignore[no-untyped-def]
    return api.post("/jobs", json={"dataset": "synthetic", **spec})


@pytest.mark.parametrize(("field", "value"), [
    ("epochs", True), ("epochs", "5"), ("epochs", 5.5), ("nproc_per_node", False),
    ("lr", "0.1"), ("lr", True), ("max_runtime_s", "60"), ("priority", "1"), ("download", 1),
    ("download", "true"), ("resume_from", "1"),
])
def test_spec_values_of_the_wrong_type_are_refused_not_coerced(
    api: TestClient, field: str, value: object
) -> None:
    r = _submit(api, **{field: value})
    assert r.status_code == 422, r.text
    assert field in r.json()["message"], r.json()


def test_json_numbers_still_work_for_numeric_fields(api: TestClient) -> None:
    r = _submit(api, epochs=5.0, lr=1, momentum=0.5, max_runtime_s=60, heartbeat_timeout_s=30.5)
    assert r.status_code == 201, r.text
    spec = r.json()["spec"]
    assert spec["epochs"] == 5 and isinstance(spec["epochs"], int)
    assert spec["lr"] == 1.0 and spec["max_runtime_s"] == 60.0


@pytest.mark.parametrize("value", ["a\x7fb", "a\x85b", "a\x9fb", "a\u2028b", "a\u2029b", "a\nb"])
def test_label_values_must_be_printable(api: TestClient, value: str) -> None:
    r = _submit(api, labels={"team": value})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "labels.team", r.text
    r = api.get("/jobs", params={"label": f"team={value}"})
    assert r.status_code == 422 and r.json()["details"][0]["field"].startswith("label"), r.text


def test_printable_unicode_label_values_are_kept(api: TestClient) -> None:
    r = _submit(api, labels={"team": "café ☕ 東京"})
    assert r.status_code == 201, r.text
    listed = api.get("/jobs", params={"label": "team=café ☕ 東京"}).json()["items"]
    assert [j["id"] for j in listed] == [r.json()["id"]]


def test_record_values_of_the_wrong_type_are_refused() -> None:
    # What the records route parses with (the route itself needs a live job token: the fuzz
    # test posts to it with one).
    for bad in ({"rank": True}, {"rank": "0"}, {"value": True}, {"value": "1.5"},
                {"time": "1"}, {"rank": 0.5}, {"extra": 1}):
        record = {"rank": 0, "name": "loss", "value": 1.0, "time": 1.0, **bad}
        with pytest.raises(ValidationError, match=next(iter(bad))):
            parse_record_batch(json.dumps({"records": [record]}).encode())
    too_big = b'{"records": [{"rank": 0, "name": "loss", "value": 1' + b"0" * 400 + b', "time": 1}]}'
    with pytest.raises(ValidationError, match="value"):  # not read as Infinity
        parse_record_batch(too_big)
    [ok] = parse_record_batch(
        b'{"records": [{"rank": 0.0, "name": "loss", "value": "NaN", "time": 1}]}')
    assert ok.rank == 0 and math.isnan(ok.value)


def test_the_strict_fast_path_reads_records_as_the_full_model_does() -> None:
    # parse_record_batch takes a batch in one strict pydantic-core pass and falls back to
    # RecordBatch only when that pass refuses it: both must give the same records.
    records = [
        {"rank": 3, "name": "loss", "value": 0.25, "time": 1.5},
        {"attempt": 2, "rank": 0, "epoch": 7, "step": 2**62, "name": "a.b:c/d-e_f", "value": 3,
         "time": 0},
        {"rank": 1, "epoch": 0, "name": "x", "value": "-Infinity", "time": 1e11},
        {"rank": 2, "epoch": None, "step": None, "name": "y", "value": "Infinity", "time": 2},
        {"rank": 65535, "name": "z", "value": -1e300, "time": 3},
    ]
    body = json.dumps({"records": records}).encode()
    fast = parse_record_batch(body)
    full = [
        (r.attempt, r.rank, r.epoch, r.step, r.name, repr(r.value), r.time)
        for r in RecordBatch.model_validate_json(body).records
    ]
    assert [(r.attempt, r.rank, r.epoch, r.step, r.name, repr(r.value), r.time)
            for r in fast] == full
    assert all(type(r.value) is float for r in fast)
    # A body only the full model takes (5.0 for the integer 5) still parses, through it.
    [five] = parse_record_batch(b'{"records": [{"rank": 5.0, "name": "n", "value": 1, "time": 1}]}')
    assert five.rank == 5 and type(five.rank) is int


def test_a_log_offset_past_any_file_is_an_empty_chunk_not_a_500(api: TestClient) -> None:
    job_id = _submit(api).json()["id"]
    settings = api.app.state.settings  # type: ignore[attr-defined]
    log = RunDir.for_job(settings.runs_dir, job_id).rank_output(1, 0)  # the default stream
    log.parent.mkdir(parents=True)
    log.write_text("hello\n")
    for offset in (0, 6, 17592186044415, LOG_OFFSET_MAX):
        r = api.get(f"/jobs/{job_id}/logs", params={"offset": offset})
        assert r.status_code == 200, r.text
        chunk = r.json()
        assert chunk["text"] == ("hello\n" if offset == 0 else "")
        assert chunk["next_offset"] == (6 if offset == 0 else offset)
    r = api.get(f"/jobs/{job_id}/logs", params={"offset": LOG_OFFSET_MAX + 1})
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "offset"


@pytest.mark.parametrize("path", ["/healthz", "/", "/static/app.js", "/static/plotly.min.js",
                                  "/docs", "/static/swagger/swagger-ui-bundle.js"])
def test_head_answers_like_get_without_a_body(api: TestClient, path: str) -> None:
    get, head = api.get(path), api.head(path)
    assert get.status_code == head.status_code == 200, (get.status_code, head.status_code)
    assert head.content == b""
    assert head.headers["content-type"] == get.headers["content-type"]


@pytest.mark.parametrize("path", ["/?x=1", "/?job=3#/jobs/3", "/docs?tag=jobs"])
def test_pages_take_any_query_string(api: TestClient, path: str) -> None:
    assert api.get(path).status_code == 200


def test_api_routes_still_refuse_unknown_and_repeated_parameters(api: TestClient) -> None:
    r = api.get("/jobs", params={"x": "1"})
    assert r.status_code == 422 and r.json()["details"][0] == {"field": "x",
                                                                "message": "unknown field"}
    r = api.get("/jobs?limit=5&limit=6")
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "limit"
    assert api.get("/jobs?label=a&label=b").status_code == 200  # a list: repeatable


@pytest.mark.parametrize("job_id", ["0", "-1", str(2**63), "99999999999999999999"])
def test_job_ids_outside_the_documented_range_are_422(api: TestClient, job_id: str) -> None:
    r = api.get(f"/jobs/{job_id}")
    assert r.status_code == 422 and r.json()["details"][0]["field"] == "job_id", r.text


def test_yaml_spec_files_read_exponent_floats_as_numbers(tmp_path) -> None:  # type: ignore[no-untyped-def]
    # PyYAML alone reads "1e-3" as a string, which the server now refuses: the CLI reads it as
    # YAML 1.2 does.
    path = tmp_path / "job.yaml"
    path.write_text("lr: 1e-3\nweight_decay: 5E-4\nepochs: 3\nname: 1e5x\n")
    spec = load_spec_file(path)
    assert spec == {"lr": 0.001, "weight_decay": 0.0005, "epochs": 3, "name": "1e5x"}
    assert yaml_value("2.5e+2") == 250.0 and yaml_value("true") is True
