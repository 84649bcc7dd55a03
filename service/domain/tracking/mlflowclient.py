"""MLflow's REST API 2.0, the calls the exporter makes, through httpx (never the ``mlflow``
package: its pins clash with the server's, and it would load in every server process).

Calls: ``experiments/get-by-name`` and ``experiments/create``, ``runs/search`` (a run by a tag),
``runs/create``, ``runs/log-batch`` (cut to MLflow's limits: at most 1000 metrics, 100 params,
100 tags and 1000 items a call), ``runs/update``, ``metrics/get-history``, and artifact uploads
through the tracking server's artifact proxy (``mlflow server --serve-artifacts``):
``PUT /api/2.0/mlflow-artifacts/artifacts/<path of the run's mlflow-artifacts: URI>/<file>``.

Failures raise :class:`MlflowError`: ``unknown_outcome`` says whether the call may have taken
effect (no answer, a timeout, a 5xx) or certainly did not (a refused connection, a 4xx). The
token (``TORCHYARD_MLFLOW_TOKEN``) goes in the Authorization header only; an error's text never
quotes a URL's password or the token.
"""

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

import httpx

from service import __version__
from service.domain.tracking.points import Point
from service.store.db import masked_url

MAX_METRICS, MAX_PARAMS, MAX_TAGS, MAX_ITEMS = 1000, 100, 100, 1000
HISTORY_PAGE = 25_000
ARTIFACT_SCHEME = "mlflow-artifacts:"
_NONFINITE_WIRE = {math.inf: "Infinity", -math.inf: "-Infinity"}
# MLflow's SQL stores keep ±inf as the largest finite double: it is read back as that.
_DOUBLE_MAX = 1.7976931348623157e308


class MlflowError(Exception):
    """A call that failed; ``unknown_outcome``: it may have taken effect all the same."""

    def __init__(self, message: str, unknown_outcome: bool, code: str | None = None) -> None:
        super().__init__(message)
        self.unknown_outcome = unknown_outcome
        self.code = code


@dataclass(frozen=True)
class RunInfo:
    run_id: str
    artifact_uri: str


def wire_value(value: float) -> float | str:
    """A metric value as MLflow's JSON takes it: non-finite ones as "NaN", "Infinity"."""
    if math.isnan(value):
        return "NaN"
    return _NONFINITE_WIRE.get(value, value)


def point_key(key: str, step: int, timestamp_ms: int, value: Any) -> tuple:
    """A point as compared with what MLflow's history answers: ±inf and the largest double are
    one value there (its SQL stores keep ±inf so), every NaN is one NaN."""
    if isinstance(value, str):
        value = float(value.replace("Infinity", "inf"))
    v = float(value)
    if math.isnan(v):
        canon: object = "NaN"
    elif v >= _DOUBLE_MAX:
        canon = "inf"
    elif v <= -_DOUBLE_MAX:
        canon = "-inf"
    else:
        canon = v
    return key, int(step), int(timestamp_ms), canon


def _chunks(items: Sequence[Any], size: int) -> Iterator[Sequence[Any]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


@dataclass
class MlflowClient:
    """One tracking server. ``client`` is shared by the exporter's threads (httpx is
    thread-safe); ``token`` is never logged."""

    base_url: str
    client: httpx.Client
    token: str | None = None

    def _headers(self) -> dict[str, str]:
        headers = {"user-agent": f"torchyard/{__version__}"}
        if self.token:
            headers["authorization"] = f"Bearer {self.token}"
        return headers

    def _call(self, method: str, path: str, *, json: Any = None,
              params: dict[str, Any] | None = None) -> dict[str, Any]:
        url = f"{self.base_url}/api/2.0/mlflow/{path}"
        try:
            response = self.client.request(method, url, json=json, params=params,
                                           headers=self._headers())
        except httpx.ConnectError as exc:
            raise MlflowError(f"cannot reach {masked_url(self.base_url)} "
                              f"({type(exc).__name__})", unknown_outcome=False) from None
        except httpx.HTTPError as exc:  # sent, perhaps acted on, not answered
            raise MlflowError(f"{path}: no answer from {masked_url(self.base_url)} "
                              f"({type(exc).__name__})", unknown_outcome=True) from None
        return _answer(path, response)

    def experiment_id(self, name: str) -> str:
        """The id of the experiment ``name``, created when missing; a deleted one is an error
        (restore it in MLflow, or name another)."""
        for _ in range(2):
            try:
                found = self._call("GET", "experiments/get-by-name",
                                   params={"experiment_name": name})["experiment"]
            except MlflowError as exc:
                if exc.code != "RESOURCE_DOES_NOT_EXIST":
                    raise
            else:
                if found.get("lifecycle_stage") == "deleted":
                    raise MlflowError(f"experiment {name!r} is deleted in MLflow",
                                      unknown_outcome=False)
                return str(found["experiment_id"])
            try:
                return str(self._call("POST", "experiments/create",
                                      json={"name": name})["experiment_id"])
            except MlflowError as exc:
                if exc.code != "RESOURCE_ALREADY_EXISTS":  # another exporter made it first
                    raise
        raise MlflowError(f"experiment {name!r}: neither found nor created",
                          unknown_outcome=False)

    def run_by_tag(self, experiment_id: str, key: str, value: str) -> RunInfo | None:
        """The active run of the experiment whose tag ``key`` is ``value``, if any."""
        answer = self._call("POST", "runs/search", json={
            "experiment_ids": [experiment_id], "max_results": 1,
            "filter": f"tags.`{key}` = '{value}'",
        })
        runs = answer.get("runs") or []
        return _run_info(runs[0]["info"]) if runs else None

    def create_run(self, experiment_id: str, name: str, start_ms: int,
                   tags: dict[str, str]) -> RunInfo:
        answer = self._call("POST", "runs/create", json={
            "experiment_id": experiment_id, "run_name": name, "start_time": start_ms,
            "tags": [{"key": k, "value": v} for k, v in tags.items()],
        })
        return _run_info(answer["run"]["info"])

    def log_batch(self, run_id: str, metrics: Sequence[Point] = (),
                  params: dict[str, str] | None = None, tags: dict[str, str] | None = None,
                  ) -> None:
        """Everything in as few calls as MLflow's limits allow: params and tags first (each call
        at most 100 of each), then metrics 1000 a call, in order."""
        param_items = [{"key": k, "value": v} for k, v in (params or {}).items()]
        tag_items = [{"key": k, "value": v} for k, v in (tags or {}).items()]
        for start in range(0, max(len(param_items), len(tag_items)), MAX_PARAMS):
            self._call("POST", "runs/log-batch", json={
                "run_id": run_id, "params": param_items[start:start + MAX_PARAMS],
                "tags": tag_items[start:start + MAX_TAGS]})
        for chunk in _chunks(metrics, MAX_METRICS):
            self._call("POST", "runs/log-batch", json={"run_id": run_id, "metrics": [
                {"key": p.key, "value": wire_value(p.value), "timestamp": p.timestamp_ms,
                 "step": p.step} for p in chunk]})

    def set_status(self, run_id: str, status: str, end_ms: int | None = None) -> None:
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if end_ms is not None:
            body["end_time"] = end_ms
        self._call("POST", "runs/update", json=body)

    def history(self, run_id: str, key: str) -> list[tuple]:
        """Every point of one series of the run, as :func:`point_key` tuples."""
        found: list[tuple] = []
        token: str | None = None
        while True:
            params: dict[str, Any] = {"run_id": run_id, "metric_key": key,
                                      "max_results": HISTORY_PAGE}
            if token:
                params["page_token"] = token
            answer = self._call("GET", "metrics/get-history", params=params)
            found += [point_key(m["key"], m.get("step", 0), m["timestamp"], m["value"])
                      for m in answer.get("metrics") or []]
            token = answer.get("next_page_token")
            if not token:
                return found

    def upload(self, artifact_uri: str, path: str, body: Iterator[bytes], size: int) -> None:
        """One file into the run's artifacts, streamed, through the server's artifact proxy."""
        url = f"{self.base_url}/api/2.0/mlflow-artifacts/artifacts/{proxied_root(artifact_uri)}/"
        url += quote(path)
        headers = {**self._headers(), "content-type": "application/octet-stream",
                   "content-length": str(size)}
        try:
            response = self.client.put(url, content=body, headers=headers)
        except httpx.ConnectError as exc:
            raise MlflowError(f"cannot reach {masked_url(self.base_url)} "
                              f"({type(exc).__name__})", unknown_outcome=False) from None
        except httpx.HTTPError as exc:
            raise MlflowError(f"artifact {path}: no answer ({type(exc).__name__})",
                              unknown_outcome=True) from None
        _answer("mlflow-artifacts", response)


def proxied_root(artifact_uri: str) -> str:
    """The proxy path of a run's artifact URI (``mlflow-artifacts:/1/<run>/artifacts`` →
    ``1/<run>/artifacts``); raises for a run whose artifacts the server does not proxy."""
    if not artifact_uri.startswith(ARTIFACT_SCHEME):
        raise MlflowError(
            f"the tracking server stores this run's artifacts at {artifact_uri.split(':')[0]}:…,"
            " not through its artifact proxy (start it with --serve-artifacts)",
            unknown_outcome=False)
    return urlsplit(artifact_uri).path.strip("/")


def _run_info(info: dict[str, Any]) -> RunInfo:
    return RunInfo(str(info.get("run_id") or info["run_uuid"]), str(info.get("artifact_uri", "")))


def _answer(path: str, response: httpx.Response) -> dict[str, Any]:
    """The JSON of a 2xx answer; else an MlflowError with MLflow's error code and message."""
    if 200 <= response.status_code < 300:
        try:
            body = response.json() if response.content else {}
        except ValueError:
            body = {}
        return body if isinstance(body, dict) else {}
    code, message = None, response.text[:300]
    try:
        body = response.json()
        code, message = body.get("error_code"), str(body.get("message", ""))[:300]
    except (ValueError, AttributeError):
        pass
    unknown = response.status_code >= 500  # a 4xx (a 429 too) was not acted on
    raise MlflowError(f"{path}: HTTP {response.status_code} {code or ''} {message}".strip(),
                      unknown_outcome=unknown, code=code)
