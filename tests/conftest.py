"""Fixtures: a migrated app, a real ``torchyard serve`` on a free port, and the store under them.

The store is SQLite unless a test is parametrized with ``both_stores`` (or
``pytest.mark.parametrize("store", [...], indirect=True)``): then it also runs against a real
PostgreSQL server that one session fixture starts (``tests.pgserver``), each test on a new
database. Without PostgreSQL installed that half is skipped with the reason, except under CI
(``CI=true``), where it fails.
"""

import compileall
import gc
import importlib.util
import os
import shutil
import signal
import socket
import sqlite3
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

import httpx
import psutil
import pytest
from fastapi.testclient import TestClient

from service.app import create_app
from service.executor.warmpool import ask, socket_path
from service.run import proctree
from service.run.warm.preload import read_at_start_up
from service.settings import Settings
from service.settings.tokens import new_token
from service.store import repository as repo
from service.store.db import upgrade
from tests import pgserver
from tests.slurmcluster import SlurmCluster, missing_programs

REPO_ROOT = Path(__file__).resolve().parents[1]
RANK_HOOKS = REPO_ROOT / "tests" / "rankhooks"
# Warm ranks are on, as they are by default: a live server's pool imports torch once (~3.5 CPU
# s, ~0.5 GB) and the server is handed to the test once the pool is ready, so every job of the
# test starts warm (a cold 2-rank job costs ~15 CPU s on 2 cores, a warm one ~5: starting jobs is
# most of what this suite spends). Tests of the cold path, and servers that run no job, set
# ``TORCHYARD_WARM_RANKS=false`` themselves.
os.environ.setdefault("TORCHYARD_WARM_RANKS", "true")
# The environment before any test module imported torch or scikit-learn, which set variables
# read at start-up of their own here (TORCHINDUCTOR_*, KMP_*): see ``child_environ``.
ENV_AT_START = dict(os.environ)
# For a server restarted only to adopt what its predecessor started: it launches nothing, so it
# needs no warm pool (~3 CPU s and the wait for the pool, per restart).
ADOPTS_ONLY = {"TORCHYARD_WARM_RANKS": "false"}
# ... and the live servers of one session (xdist worker) that keep the default warm settings
# share one warm server, as servers naming the same TORCHYARD_WARM_DIR do (docs/warm-ranks.md):
# the first one's pool starts it, the session owns it too (``_await_warm_pool``), so it outlives
# each test's servers and drains when the session ends. Each server start otherwise imported
# torch again (~3.5 CPU s, ~40 times a run). A server that sets a TORCHYARD_WARM_* variable of
# its own (pool size, preload, budget, directory) gets a warm server of its own.
SHARED_WARM_DIRS: list[Path] = []  # the session's directory, once ``_shared_warm_dir`` made it
TERMINAL = {"succeeded", "failed", "cancelled"}
# ``LiveServer.wait_for``'s long-poll rounds: a state outside ``allowed`` fails within one.
WAIT_ROUND_S = 3.0
# One TLS context for every client a test makes (``LiveServer.client``, the start-up poll):
# httpx otherwise builds one per client, loading certifi's CA bundle (~40 ms of CPU each), for
# servers that are plain http on loopback. Thousands of clients a run: about 60 CPU s.
LOOPBACK_TLS = ssl.create_default_context()
STORES = ["sqlite", "postgresql"]
# Run a test once per store (the ``store`` fixture below reads the parameter).
both_stores = pytest.mark.parametrize("store", STORES, indirect=True)



# How pytest-xdist (``--dist loadgroup``) shares the tests between workers. A test runs on
# whichever worker is free, except: the tests of a file that share a module-scoped server or
# cluster stay together (one group per file), the Slurm files share one cluster (group
# ``slurm``), and the failover tests, whose takeover bounds are timed, run one after another
# (group ``failover``). The heaviest work goes first, so that no worker is left with a long
# test at the end while the other idles (``--no-loadscope-reorder`` keeps this order).
XDIST_GROUPS = {
    "test_slurm.py": "slurm", "test_slurm_security.py": "slurm",
    "test_slurm_pending_cancel.py": "slurm", "test_slurm_run_as.py": "slurm",
    "test_slurm_accounts.py": "slurm",
    "test_failover.py": "failover",
    # Their plain torchrun groups share one warm server (tests/worker/conftest.py).
    "test_checkpoint.py": "rungroup", "test_worker_unit.py": "rungroup",
    **{name: name for name in (
        "test_dashboard.py", "test_fuzz.py", "test_hostile_scripts.py",
        "test_fair_share_live.py", "test_dashboard_teams.py",
        "test_openapi.py", "test_warm_security.py", "test_warm_server.py",
    )},
}
# Files by their tests' total duration, longest first (``--durations=0`` on 2 cores).
HEAVY_FIRST = [
    "test_slurm.py", "test_slurm_security.py", "test_failover.py", "test_bench_smoke.py",
    "test_queue_live.py", "test_fair_share_live.py", "test_e2e.py", "test_warm_jobs.py", "test_workers.py",
    "test_fault.py", "test_dashboard.py", "test_dashboard_pages.py", "test_cli.py",
    "test_datasets_e2e.py",
    "test_warm_security.py", "test_checkpoint.py", "test_script_jobs.py",
    "test_hostile_scripts.py", "test_worker_processes.py", "test_fuzz.py", "test_events.py",
]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--bench", action="store_true",
        help="also run the benchmarks at smoke sizes (marker 'bench'; CI: pytest --bench -m bench)",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Byte-compile the project once, before any worker or server starts: a run starts ~2,500
    Python processes (servers, attempt loops, tees, ranks), and where ``PYTHONDONTWRITEBYTECODE``
    is set none of them writes a ``.pyc``, so each compiled every module it imported anew
    (~0.2 CPU s of a server start). Python still reads ``.pyc`` files under that setting."""
    if hasattr(config, "workerinput"):  # an xdist worker: the controller did it
        return
    if config.getoption("numprocesses", None):
        gc.enable()  # xdist's controller collects nothing: it would never turn it back on
    for package in ("service", "worker", "torchyard_contract", "migrations", "tests"):
        compileall.compile_dir(REPO_ROOT / package, quiet=2, workers=1)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection built (it lasts the session: later passes need not walk it) and
    turn the collector back on (off since ``tests`` was imported: tests/__init__.py)."""
    gc.freeze()
    gc.enable()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """``-n auto``: one worker more than the cores. With warm ranks a live test spends much of
    its time waiting (a heartbeat timeout, a deadline, a failover, Slurm's scheduler), and the
    extra worker fills that; more than one extra only added contention (measured on 2 cores)."""
    return (os.cpu_count() or 1) + 1


def _xdist_group(item: pytest.Item) -> str | None:
    """The group of ``item``: ``XDIST_GROUPS``, else a file whose tests share a module-scoped
    server stays on one worker (one server, not one per worker). A Slurm test elsewhere may
    start a second cluster (session-scoped: one per worker) rather than wait for the group."""
    group = XDIST_GROUPS.get(item.path.name)
    if group is not None:
        return group
    info = getattr(item, "_fixtureinfo", None)
    defs = info.name2fixturedefs.values() if info is not None else ()
    if any(d and d[-1].scope == "module" for d in defs):
        return item.path.name
    return None


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the xdist_group marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("bench"):
        # The benchmarks' smoke runs check that bench/ still runs (~4 CPU-minutes of cold
        # jobs and baselines): a step of their own in CI, not part of every run of the suite.
        benches = [item for item in items if item.get_closest_marker("bench")]
        if benches:
            config.hook.pytest_deselected(items=benches)
            items[:] = [item for item in items if not item.get_closest_marker("bench")]
    for item in items:
        group = _xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    rank = {name: i for i, name in enumerate(HEAVY_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))  # stable: file order kept


def child_environ() -> dict[str, str]:
    """The environment for a process a test starts (a server, a plain group): this process's,
    without pytest's ``PYTEST_*`` and with the variables read at start-up as they were when the
    session began. A library a test imported in this process sets some (scikit-learn two
    ``KMP_*``); a server started after that passed them to its jobs, whose relays found they
    differ from the session's warm server (started before) and rightly started cold: every
    later job of that xdist worker cold, CI's run of 1276354. (``PYTEST_CURRENT_TEST`` differs
    in every test and torch reads it at import: a job carrying it would start cold as well.)"""
    now = {k: v for k, v in os.environ.items() if not read_at_start_up(k)}
    began = {k: v for k, v in ENV_AT_START.items() if read_at_start_up(k)}
    return {k: v for k, v in (now | began).items() if not k.startswith("PYTEST_")}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[pgserver.PgServer]:
    """One PostgreSQL server for the session; skipped (failed under CI=true) when not installed."""
    bindir = pgserver.find_bindir()
    reason = None
    if bindir is None:
        reason = "PostgreSQL is not installed (apt-get install postgresql): initdb not found"
    elif importlib.util.find_spec("psycopg") is None:
        reason = "psycopg is not installed (pip install -e '.[postgres]')"
    if reason is not None:
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    assert bindir is not None
    server = pgserver.start(bindir, free_port())
    yield server
    server.stop()


@pytest.fixture(autouse=True)
def _testclient_host(monkeypatch: pytest.MonkeyPatch) -> None:
    """Starlette's TestClient sends ``Host: testserver``: a name the server must be told about,
    as an operator would (``service.api.middleware.browserguard`` refuses unknown names without tokens)."""
    monkeypatch.setenv("TORCHYARD_ALLOWED_HOSTS", "testserver")


@pytest.fixture
def store(request: pytest.FixtureRequest) -> str:
    """``sqlite`` unless the test is parametrized over ``STORES``."""
    return getattr(request, "param", "sqlite")


@pytest.fixture
def empty_database_url(store: str, request: pytest.FixtureRequest) -> str | None:
    """An empty database: None = SQLite under the server's home; else a new PostgreSQL one."""
    if store == "sqlite":
        return None
    server: pgserver.PgServer = request.getfixturevalue("postgres_server")
    return server.create_database()


@pytest.fixture(scope="session")
def _migrated_sqlite(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated by Alembic once per session (per xdist worker), for copies."""
    path = tmp_path_factory.mktemp("migrated") / "torchyard.db"
    upgrade(f"sqlite:///{path}")
    return path


def _copy_sqlite(migrated: Path, home: Path) -> None:
    """The migrated SQLite file into ``home``, where the server keeps its database."""
    home.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(migrated) as src, sqlite3.connect(home / "torchyard.db") as dst:
        src.backup(dst)


@pytest.fixture
def database_url(
    store: str, tmp_path: Path, request: pytest.FixtureRequest, _migrated_sqlite: Path
) -> str | None:
    """The test's database, already at the migrations' head: None = SQLite under the server's
    home ``tmp_path / "home"`` (a copy of the file migrated once per session), else a new
    PostgreSQL one (``CREATE DATABASE … TEMPLATE`` of one migrated once per session). The
    server's own upgrade then finds nothing to do; the migrations themselves are tested from an
    empty database (``empty_database_url``, tests/store/test_migrations.py)."""
    if store == "sqlite":
        _copy_sqlite(_migrated_sqlite, tmp_path / "home")
        return None
    server: pgserver.PgServer = request.getfixturevalue("postgres_server")
    return server.create_database(template=server.migrated_template())


@pytest.fixture
def api(tmp_path: Path, database_url: str | None) -> Iterator[TestClient]:
    """The app on a fresh database at the migrations' head; the supervisor loop does not run."""
    settings = Settings(
        home=tmp_path / "home", cpu_slots=4, gpus="none", database_url=database_url
    )
    app = create_app(settings, run_supervisor=False)
    with TestClient(app, raise_server_exceptions=False) as client:
        yield client


@dataclass
class LiveServer:
    url: str
    port: int
    home: Path
    proc: subprocess.Popen[bytes]
    log: Path
    token: str | None = None  # the first of TORCHYARD_API_TOKENS, when the server has tokens
    warm_dir: Path | None = None  # TORCHYARD_WARM_DIR: the session's shared warm server

    @property
    def warm_socket(self) -> str:
        """The socket of this server's warm server (its own, or the session's)."""
        return socket_path(self.home, self.warm_dir)

    def client(self) -> httpx.Client:
        headers = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return httpx.Client(base_url=self.url, timeout=10, headers=headers, verify=LOOPBACK_TLS)

    def wait_for(
        self, job_id: int, states: set[str], timeout_s: float = 120,
        allowed: set[str] | None = None,
    ) -> dict:
        """Until the job is in ``states``; fail on a state outside ``allowed``. Terminal
        ``states`` are awaited through the long poll (``/jobs/{id}/wait``, in rounds of
        ``WAIT_ROUND_S``, each checking ``allowed``); others by polling every 0.2 s."""
        allowed = (allowed or {"queued", "starting", "running"}) | states
        deadline = time.monotonic() + timeout_s
        terminal = states <= TERMINAL
        with self.client() as c:
            while True:
                assert self.proc.poll() is None, f"server died:\n{self.log.read_text()[-3000:]}"
                if terminal:
                    wait_s = max(0.0, min(WAIT_ROUND_S, deadline - time.monotonic()))
                    job = c.get(f"/jobs/{job_id}/wait", params={"timeout": wait_s},
                                timeout=wait_s + 10).json()
                else:
                    job = c.get(f"/jobs/{job_id}").json()
                if job["state"] in states:
                    return job
                assert job["state"] in allowed, f"unexpected state {job['state']}: {job['reason']}"
                assert time.monotonic() < deadline, f"timed out waiting for {states}: {job}"
                if not terminal:
                    time.sleep(0.2)


def assert_no_slot_held_twice(jobs: list[dict]) -> None:
    """No two of the finished ``jobs`` held one GPU or slot at the same time, by their own times:
    ``ended_at`` is taken before a job's resources are freed and ``started_at`` in the transaction
    that allocates them. (A job's ``devices`` stay on it once they are freed, while the finisher
    still stores its spools, so sampling running jobs' devices shows a freed slot twice.) At least
    two of them must have run at the same time, or the check would prove nothing."""
    spans = [(datetime.fromisoformat(j["started_at"]), datetime.fromisoformat(j["ended_at"]), j)
             for j in jobs if j["started_at"]]
    side_by_side = 0
    for i, (a_start, a_end, a) in enumerate(spans):
        for b_start, b_end, b in spans[i + 1:]:
            apart = a_end <= b_start or b_end <= a_start
            if set(a["devices"]) & set(b["devices"]):
                assert apart, f"a slot held by two jobs at once: {a} {b}"
            side_by_side += not apart
    assert side_by_side, "no two jobs ran at the same time: the check proved nothing"


def every_record(server: LiveServer, job_id: int) -> list[dict]:
    """Every record of the job, page by page through the ``?after=`` cursor."""
    items, after = [], 0
    with server.client() as c:
        while page := c.get(f"/jobs/{job_id}/metrics", params={"after": after}).json()["items"]:
            items += page
            after = page[-1]["seq"]
    return items


def assert_each_record_once(items: list[dict]) -> None:
    """No record stored twice: each (attempt, rank, epoch, step, name) at most once."""
    keys = Counter((i["attempt"], i["rank"], i["epoch"], i["step"], i["name"]) for i in items)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]


def _start_server(
    home: Path, extra_env: dict[str, str], port: int | None = None, args: tuple[str, ...] = ()
) -> LiveServer:
    """A server on ``port``, else on a free one: ``free_port()`` releases the port it found, so
    another process may take it before the server binds; then the server exits at once with
    "address already in use" and it is started again on another free port (up to 3 times)."""
    if port is not None:
        return _start_server_on(home, extra_env, port, args)
    for attempt in range(3):
        try:
            return _start_server_on(home, extra_env, free_port(), args)
        except _PortTaken:
            if attempt == 2:
                raise
    raise AssertionError("unreachable")


class _PortTaken(AssertionError):
    """The server exited because its port was bound by someone else first."""


def _start_server_on(
    home: Path, extra_env: dict[str, str], port: int, args: tuple[str, ...]
) -> LiveServer:
    own_warm = any(k.startswith("TORCHYARD_WARM_") and k != "TORCHYARD_WARM_RANKS"
                   for k in extra_env)
    shared_warm = {} if own_warm or not SHARED_WARM_DIRS else {
        "TORCHYARD_WARM_DIR": str(SHARED_WARM_DIRS[0])}
    env = {
        **child_environ(),  # as the session's shared warm server has it
        **shared_warm,
        "TORCHYARD_HOME": str(home),
        "TORCHYARD_PORT": str(port),
        "TORCHYARD_GPUS": "none",
        "TORCHYARD_CPU_SLOTS": "4",
        "TORCHYARD_STOP_GRACE_S": "3",
        "OMP_NUM_THREADS": "1",
        "TORCHYARD_DATA_DIRS": str(home.parent),  # tests name dataset roots under tmp_path
        # Every job process imports tests/rankhooks/sitecustomize.py: the TORCHYARD_TEST_* hooks.
        "PYTHONPATH": os.pathsep.join(
            p for p in (str(RANK_HOOKS), os.environ.get("PYTHONPATH")) if p
        ),
        **extra_env,
    }
    home.mkdir(parents=True, exist_ok=True)
    log = home / f"server-{time.time_ns()}.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "service", "serve", *args],
        env=env, cwd=REPO_ROOT, stdout=log.open("wb"), stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}"
    tokens = [t for t in env.get("TORCHYARD_API_TOKENS", "").split(",") if t.strip()]
    warm_dir = env.get("TORCHYARD_WARM_DIR")
    server = LiveServer(url=url, port=port, home=home, proc=proc, log=log,
                        token=tokens[0].strip() if tokens else None,
                        warm_dir=Path(warm_dir) if warm_dir else None)
    try:
        _await_health(proc, log, url, port)
        _await_warm_pool(server)
    except BaseException:
        # A server that never got ready still runs (and may own the shared warm server): left
        # behind, it outlived the session (a minute's stall of this VM's host, 2026-12-07).
        _stop_process(proc)
        raise
    return server


def _await_health(proc: subprocess.Popen, log: Path, url: str, port: int) -> None:
    """Until ``/healthz`` answers 200; raises if the server exits first or takes over 30 s."""
    deadline = time.monotonic() + 30
    with httpx.Client(timeout=1, verify=LOOPBACK_TLS) as poll:
        while True:
            if proc.poll() is not None:
                text = log.read_text()
                if "address already in use" in text.lower():
                    raise _PortTaken(f"port {port} taken:\n{text[-2000:]}")
                raise AssertionError(f"server exited:\n{text}")
            try:
                if poll.get(f"{url}/healthz").status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "server did not answer in 30 s"
            time.sleep(0.1)


def _await_warm_pool(server: LiveServer, timeout_s: float = 120) -> None:
    """Until the server's warm pool is ready (or broken: tests of a broken pool), so the test's
    jobs start warm rather than cold while the pool still imports torch. At once where the
    server has no pool (warm ranks off, the Slurm executor): ``/resources`` says ``warm: null``."""
    deadline = time.monotonic() + timeout_s
    with server.client() as c:
        while True:
            assert server.proc.poll() is None, f"server died:\n{server.log.read_text()[-3000:]}"
            warm = c.get("/resources").json().get("warm") or {}
            if warm.get("state") == "ready" and server.warm_dir in SHARED_WARM_DIRS:
                # The session owns the shared one too: it outlives the server that started it.
                ask(server.warm_socket, {"op": "status", "owner": os.getpid()})
            if warm.get("state") in ("ready", "broken") or not warm:
                return
            assert time.monotonic() < deadline, f"warm pool not ready in {timeout_s} s: {warm}"
            time.sleep(0.2)


def _stop_server(server: LiveServer) -> None:
    _stop_process(server.proc)


def _stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM, 15 s, then SIGKILL."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def live_server_factory(
    tmp_path: Path, database_url: str | None, _migrated_sqlite: Path
) -> Iterator[Callable[..., LiveServer]]:
    """Starts servers; on PostgreSQL every server of the test shares the test's database. A new
    server's database starts at the migrations' head (a copy: see ``database_url``)."""
    started: list[LiveServer] = []
    store_env = {"TORCHYARD_DATABASE_URL": database_url} if database_url else {}

    def start(
        _home: Path | None = None, _port: int | None = None, _args: tuple[str, ...] = (),
        **extra_env: str,
    ) -> LiveServer:
        """A new server; pass ``_home`` and ``_port`` of an old one to restart it in place;
        ``_args``: more arguments of ``torchyard serve``."""
        home = _home or tmp_path / f"home{len(started)}"
        if not database_url and not (home / "torchyard.db").exists():
            _copy_sqlite(_migrated_sqlite, home)
        server = _start_server(home, {**store_env, **extra_env}, _port, _args)
        started.append(server)
        return server

    yield start
    for server in started:
        _stop_server(server)
    _kill_left_behind(tmp_path)


def _kill_left_behind(root: Path) -> None:
    """SIGKILL every process still running something under ``root``, with its descendants: a
    job's attempt loop outlives its server by design (a restart adopts it), so a job a test left
    running — cancelled just before the end, or never finished — ran on for minutes beside
    later tests."""
    prefix = str(root)
    for proc in psutil.process_iter(["cmdline"]):
        if any(arg.startswith(prefix) or f"={prefix}" in arg for arg in proc.info["cmdline"] or ()):
            proctree.kill_tree(proc.pid)


@pytest.fixture(scope="session", autouse=True)
def _shared_warm_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """The directory of the session's shared warm server (``SHARED_WARM_DIRS``); at the end the
    session gives its ownership back (the server drains once no test server owns it either)."""
    directory = tmp_path_factory.mktemp("warm-shared") / "warm"  # created 0700 by the pools
    SHARED_WARM_DIRS.append(directory)
    yield
    SHARED_WARM_DIRS.remove(directory)
    ask(str(directory / "server.sock"), {"op": "release", "owner": os.getpid()})


@pytest.fixture
def live_server(live_server_factory: Callable[..., LiveServer]) -> LiveServer:
    """A server of the test's own, on the test's store: for tests that need an empty server.
    Tests that only need their jobs run take ``shared_server``."""
    return live_server_factory()


@pytest.fixture(scope="session")
def _shared_server(
    tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    home = tmp_path_factory.mktemp("shared") / "home"
    _copy_sqlite(_migrated_sqlite, home)
    # Dataset roots under any test's tmp_path (the session's base temp holds them all).
    server = _start_server(home, {"TORCHYARD_DATA_DIRS": str(tmp_path_factory.getbasetemp())})
    yield server
    _stop_server(server)


@pytest.fixture
def shared_server(_shared_server: LiveServer) -> Iterator[LiveServer]:
    """One server with the default settings (SQLite, warm ranks, 4 CPU slots, no tokens) per
    session, i.e. per xdist worker, shared by every test (and module fixture, through
    ``_shared_server``) that needs nothing of a server but that it runs its jobs: a server
    start costs ~1.4 CPU s (its warm pool is the session's). Other tests' jobs are on it too, so a test reads
    its own jobs by id and never counts the server's jobs, its free slots or its queue; per-job
    rank hooks (``hooks``) stand in for the ``TORCHYARD_TEST_*`` server variables. Jobs the test
    left unfinished are cancelled after it, so that they hold no slot of the next test."""
    with _cancelled_after(_shared_server):
        yield _shared_server


# The shared script server's token: tests read it as ``server.token`` (``client()`` sends it).
SHARED_API_TOKEN = "shared-script-server-api-token-0123456789"


@pytest.fixture(scope="session")
def _shared_script_server(
    tmp_path_factory: pytest.TempPathFactory, _migrated_sqlite: Path
) -> Iterator[LiveServer]:
    root = tmp_path_factory.mktemp("shared-scripts")
    (root / "scripts").mkdir()
    _copy_sqlite(_migrated_sqlite, root / "home")
    server = _start_server(root / "home", {
        "TORCHYARD_SCRIPT_DIRS": str(root / "scripts"), "TORCHYARD_API_TOKENS": SHARED_API_TOKEN,
        "TORCHYARD_DATA_DIRS": str(tmp_path_factory.getbasetemp()),
    })
    yield server
    _stop_server(server)


@pytest.fixture
def shared_script_server(_shared_script_server: LiveServer) -> Iterator[LiveServer]:
    """As ``shared_server``, with script jobs on: API tokens (``server.token``) and a script
    directory (``add_script``). One per session (per xdist worker)."""
    with _cancelled_after(_shared_script_server):
        yield _shared_script_server


def add_script(server: LiveServer, name: str, text: str) -> Path:
    """``name`` (``a.py``, ``pkg/mod.py``) into the script directory of the shared script
    server, which every file's tests share: the same name with other text fails."""
    path = server.home.parent / "scripts" / name
    if path.exists():
        assert path.read_text() == text, f"two tests' scripts named {name} differ"
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_name(f".{path.name}.partial")  # never half a script under its name
    partial.write_text(text)
    partial.rename(path)
    return path


@contextmanager
def _cancelled_after(server: LiveServer) -> Iterator[None]:
    """Cancels the jobs submitted inside the block that are not finished at its end."""
    with server.client() as c:
        newest = c.get("/jobs", params={"limit": 1}).json()["items"]
    first_id = newest[0]["id"] + 1 if newest else 1
    yield
    if server.proc.poll() is not None:
        return
    with server.client() as c:
        for job in c.get("/jobs", params={"limit": 500}).json()["items"]:
            if job["id"] >= first_id and job["state"] not in TERMINAL:
                c.post(f"/jobs/{job['id']}/cancel")


def hooks(epoch_sleep_s: float | None = None, fail_rank: int | None = None) -> dict[str, str]:
    """Job labels that turn on the rank hooks (``tests/rankhooks``) for that job alone:
    ``{"labels": hooks(epoch_sleep_s=0.5)}``; as ``TORCHYARD_TEST_EPOCH_SLEEP_S`` and
    ``TORCHYARD_TEST_FAIL_RANK`` do for every job of a server."""
    labels = {}
    if epoch_sleep_s is not None:
        labels["test.epoch_sleep_s"] = str(epoch_sleep_s)
    if fail_rank is not None:
        labels["test.fail_rank"] = str(fail_rank)
    return labels


def give_token(api: TestClient, job_id: int) -> str:
    """Put the job where a launched job is (starting, with a token), as the supervisor would."""
    token, digest = new_token()
    with api.app.state.session_factory() as session:
        assert repo.transition(session, job_id, repo.JobState.starting, token_hash=digest)
        session.commit()
    return token


def gone(pid: int, timeout_s: float = 10) -> bool:
    """Whether the process ends (or is a zombie) within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


CLI_TIMEOUT_S = 240


def cli(
    server: LiveServer, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m service ARGS`` with the server's URL in the environment, wide output."""
    env = {**os.environ, "TORCHYARD_URL": server.url, "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "service", *args], env=env, cwd=REPO_ROOT, capture_output=True,
        text=True, timeout=CLI_TIMEOUT_S, check=False,
    )


def leader_and_standby(
    factory: Callable[..., LiveServer], **env: str
) -> tuple[LiveServer, LiveServer]:
    """(leader, standby) on one database and one home: the leader starts first and takes the
    lease; both give their jobs the standby's URL (tests/serve/test_failover.py)."""
    standby_port = free_port()
    shared = {"TORCHYARD_PUBLIC_URL": f"http://127.0.0.1:{standby_port}",
              "TORCHYARD_TEST_EPOCH_SLEEP_S": "0.5", **env}
    leader = factory(**shared)
    standby = factory(leader.home, standby_port, **shared)
    return leader, standby


# Slurm: one test cluster per session (per xdist worker), shared by every test that asks for it
# (tests/slurm/, and the Slurm cases of tests/lifecycle/). ``slurm.env`` points a server at it.
@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_programs()
    if missing:
        reason = f"Slurm tests need slurm-wlm and munge; missing: {', '.join(missing)}"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    # A short path: munged's socket must fit a unix socket address (108 bytes).
    root = Path(tempfile.mkdtemp(prefix="ty-slurm-"))
    cluster = SlurmCluster.start(root)
    try:
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def slurm_server(
    slurm: SlurmCluster, live_server_factory: Callable[..., LiveServer]
) -> Callable[..., LiveServer]:
    """``start(**env)``: a torchyard server on the Slurm executor of the test cluster."""
    slurm.cancel_all()  # a previous test's leftovers must not hold the nodes

    def start(_home: Path | None = None, _port: int | None = None, **env: str) -> LiveServer:
        return live_server_factory(_home, _port, **slurm_server_env(slurm, **env))

    return start


def slurm_server_env(slurm: SlurmCluster, **env: str) -> dict[str, str]:
    """A server's environment for the Slurm executor of the test cluster, plus ``env``."""
    return {"TORCHYARD_EXECUTOR": "slurm", "TORCHYARD_STOP_GRACE_S": "2", **slurm.env, **env}


@contextmanager
def module_slurm_server(
    slurm: SlurmCluster, home: Path, migrated: Path, **env: str
) -> Iterator[LiveServer]:
    """A Slurm-executor server for a module's tests that leave it running (those that kill or
    restart it, or need other settings, take ``slurm_server``): a start costs ~3 CPU s."""
    _copy_sqlite(migrated, home)
    server = _start_server(home, slurm_server_env(slurm, **env))
    try:
        yield server
    finally:
        _stop_server(server)


def slurm_state(slurm: SlurmCluster, server: LiveServer, job_id: int) -> str | None:
    """Slurm's state of the job, found by its working directory (every test's server numbers
    its jobs from 1, and they all share one cluster); None once Slurm has forgotten it."""
    run_dir = str((server.home / "runs" / str(job_id)).resolve())
    out = slurm.run("squeue", "-h", "-t", "all", "-o", "%T|%Z", check=False).stdout
    states = [line.split("|")[0] for line in out.splitlines() if line.endswith(f"|{run_dir}")]
    return states[-1] if states else None
