"""``GET /metrics``: Prometheus text exposition, from one ``CollectorRegistry`` per app.

Series:

* ``torchyard_jobs{state}`` — jobs in each state (every state, 0 included).
* ``torchyard_queue_length`` — queued jobs.
* ``torchyard_resources{kind}`` / ``torchyard_resources_allocated{kind}`` — GPUs (``kind="gpu"``)
  or CPU slots (``kind="cpu"``) the host offers / jobs hold now.
* ``torchyard_warm_processes{state}`` (``idle``/``active``), ``torchyard_warm_memory_bytes``,
  ``torchyard_warm_handoffs_total`` / ``torchyard_warm_refused_total`` (current warm server),
  ``torchyard_warm_ready`` — the warm-rank pool, only when warm ranks are on.
* ``torchyard_metric_records_ingested_total`` — records stored by ``POST /jobs/{id}/records``
  since the process started (replays not counted).
* ``torchyard_http_request_duration_seconds{route,method,status}`` — time to the response
  headers (for an event stream: until it starts), by route template, so the label set stays
  small; unknown paths are ``route="unmatched"``.

Job and resource gauges are read from the database at scrape time, so they are right after a
restart and need no bookkeeping on the hot paths. Under ``serve --workers N`` the counters and
the histogram are every API process's, summed (prometheus-client's multiprocess mode).
"""

import time
from collections.abc import Iterator
from pathlib import Path

from fastapi import APIRouter, Request, Response
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.multiprocess import MultiProcessCollector
from prometheus_client.registry import Collector
from sqlalchemy.orm import Session, sessionmaker
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.domain.files.diskspace import free_bytes
from service.domain.queue.inventory import Inventory
from service.executor.base import WarmReporter, WarmStatus
from service.store import repository as repo
from torchyard_contract.state import JobState

router = APIRouter(tags=["meta"])
RESOURCE_KINDS = ("gpu", "cpu")
# prometheus-client's own variable: read by it at import, and by ``create_app_from_environment``.
PROMETHEUS_DIR_VARIABLE = "PROMETHEUS_MULTIPROC_DIR"


class StateCollector(Collector):
    """Job counts and resource use, read from the database on each scrape."""

    def __init__(
        self, session_factory: sessionmaker[Session], inventory: Inventory,
        warm: WarmReporter | None = None, home: Path | None = None,
    ) -> None:
        self._session_factory = session_factory
        self._inventory = inventory
        self._warm = warm
        self._home = home

    def collect(self) -> Iterator[Metric]:
        with self._session_factory() as session:
            by_state = repo.count_jobs_by_state(session)
            held = repo.allocated_resources(session)
            preemptions = repo.count_preemptions(session)
        jobs = GaugeMetricFamily("torchyard_jobs", "Jobs in each state.", labels=["state"])
        for state in JobState:
            jobs.add_metric([state.value], by_state.get(state.value, 0))
        yield jobs
        yield CounterMetricFamily(
            "torchyard_preemptions", "Jobs paused to run a job of higher priority (of the jobs "
            "kept).", value=preemptions)
        yield GaugeMetricFamily(
            "torchyard_queue_length", "Queued jobs.", value=by_state.get(JobState.queued.value, 0)
        )
        total = GaugeMetricFamily(
            "torchyard_resources", "GPUs or CPU slots the host offers.", labels=["kind"]
        )
        allocated = GaugeMetricFamily(
            "torchyard_resources_allocated", "GPUs or CPU slots held by jobs.", labels=["kind"]
        )
        for kind in RESOURCE_KINDS:
            total.add_metric([kind], len(self._inventory.resource_names(kind)))
            allocated.add_metric([kind], sum(1 for r in held if r.startswith(f"{kind}:")))
        yield total
        yield allocated
        if self._home is not None:
            yield GaugeMetricFamily(
                "torchyard_disk_free_bytes",
                "Free space under TORCHYARD_HOME (new jobs and uploads get 507 below "
                "TORCHYARD_DISK_FREE_FLOOR_BYTES).", value=free_bytes(self._home),
            )
        if self._warm is not None:
            yield from _warm_metrics(self._warm.status())


def _warm_metrics(status: WarmStatus) -> Iterator[Metric]:
    procs = GaugeMetricFamily(
        "torchyard_warm_processes", "Warm-rank processes, idle or running a rank.",
        labels=["state"],
    )
    procs.add_metric(["idle"], status.idle)
    procs.add_metric(["active"], status.active)
    yield procs
    yield GaugeMetricFamily("torchyard_warm_ready", "1 while the warm server serves.",
                            value=1 if status.state == "ready" else 0)
    yield GaugeMetricFamily("torchyard_warm_memory_bytes",
                            "RSS of the warm server plus its idle processes' own pages.",
                            value=status.memory_bytes)
    yield CounterMetricFamily("torchyard_warm_handoffs", "Warm hand-offs (current server).",
                              value=status.served)
    yield CounterMetricFamily("torchyard_warm_refused",
                              "Hand-offs refused, started cold (current server).",
                              value=status.refused)


class Telemetry:
    """The app's registry and the instruments code paths update.

    ``multiprocess_dir``: set when this process is one of ``serve --workers N``
    (``PROMETHEUS_MULTIPROC_DIR``, which prometheus-client also read when it was imported, so
    the instruments write their values there). A scrape lands on any one API process, so it must
    show every process's counts summed, not its own: per-process counters would jump up and down
    between scrapes and read as resets.
    """

    def __init__(
        self, session_factory: sessionmaker[Session], inventory: Inventory,
        warm: WarmReporter | None = None, multiprocess_dir: Path | None = None,
        home: Path | None = None,
    ) -> None:
        state = StateCollector(session_factory, inventory, warm, home)
        self.registry = CollectorRegistry()  # no auto_describe: it would query the DB at startup
        if multiprocess_dir is None:
            self.registry.register(state)
            self.exposition = self.registry
        else:
            # The instruments stay in ``registry`` (their values go to the shared directory);
            # scrapes read every API process's files, plus the database gauges once.
            self.exposition = CollectorRegistry()
            MultiProcessCollector(self.exposition, path=str(multiprocess_dir))
            self.exposition.register(state)
        self.records_ingested = Counter(
            "torchyard_metric_records_ingested", "Metric records stored (replays not counted).",
            registry=self.registry,
        )
        self.request_seconds = Histogram(
            "torchyard_http_request_duration_seconds",
            "HTTP request latency to the response headers.",
            ["route", "method", "status"],
            registry=self.registry,
        )


class RequestTimer:
    """ASGI middleware: observes each HTTP request in ``Telemetry.request_seconds``."""

    def __init__(self, app: ASGIApp, telemetry: Telemetry) -> None:
        self.app = app
        self.histogram = telemetry.request_seconds

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        observed = False

        def observe(status: int) -> None:
            nonlocal observed
            observed = True
            # The router stores the matched route in the (shared) scope.
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.histogram.labels(route, scope["method"], str(status)).observe(
                time.perf_counter() - started
            )

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not observed:
                observe(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, timed_send)
        finally:
            if not observed:
                observe(500)  # an exception escaped; the outermost handler answers 500


@router.get("/metrics", include_in_schema=True, response_class=Response)
def prometheus_metrics(request: Request) -> Response:
    """Prometheus text format (see the module doc for the series)."""
    telemetry: Telemetry = request.app.state.telemetry
    return Response(generate_latest(telemetry.exposition), media_type=CONTENT_TYPE_LATEST)
