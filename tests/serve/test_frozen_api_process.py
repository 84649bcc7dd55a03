"""An API process frozen (SIGSTOP) while it holds a database lock stalls no other API process.

``torchyard serve --workers 2`` on SQLite and on PostgreSQL: one API process is frozen inside a record
batch's transaction, holding its lock (SQLite's write lock, or the job's record lock on
PostgreSQL). The test freezes it there by watching the lock, not by a pause in the product: on
PostgreSQL it holds the job's record lock itself until the API process's batch waits for it, freezes
the API process, then lets the lock go to it (``pg_locks`` shows the frozen API process's transaction
holding it); on SQLite it freezes the API process the moment ``/proc/locks`` shows it holding the
write lock, and keeps it frozen if it still does (else thaws it and tries another batch). The
other API process keeps answering ``/healthz`` and reads at once, even with more record posts waiting
than it has threads (awaited as read by it, ``await_requests_read``); writes that need the held
lock are answered 503 with ``Retry-After`` within the lock timeout (bounded slots plus the lock
wait), never hang; and after SIGCONT every retried batch lands exactly once. Below that, the
pieces: the lock waits of ``service.store.db`` and the reporter's handling of ``Retry-After``.
"""

import asyncio
import json
import math
import os
import signal
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from sqlalchemy import text

from service.api.middleware.writegate import WRITE_SLOTS
from service.domain.loop.finisher import Finisher
from service.settings.tokens import new_token
from service.store import records as recordstore
from service.store import repository as repo
from service.store.db import is_busy, make_engine, make_session_factory, upgrade, with_lock_timeout
from service.store.records import RecordIn
from tests.conftest import LiveServer, both_stores, every_record
from tests.fixtures.connections import await_requests_read
from torchyard_contract.rundir import RunDir
from torchyard_contract.spec import JobSpec
from torchyard_contract.state import JobState
from worker import reporter as reporter_module
from worker.env import WorkerEnv
from worker.reporter import Reporter

LOCK_TIMEOUT_S = 2.0
# Batches posted to catch the SQLite API process inside one (each ~50 ms long; about half are caught).
CATCH_TRIES = 40
BALLAST = 999  # records beside the batch's loss: a transaction long enough to be seen
# Record posts sent at once to the healthy API process: more than Starlette's 40 threads.
BURST = 45
# A slot wait plus a lock wait, each at most the lock timeout; then scheduling slack.
ANSWER_WITHIN_S = 2 * LOCK_TIMEOUT_S + 3.0
QUICK_S = 1.5
NO_ANSWER = 0
RETRY_AFTER = str(math.ceil(LOCK_TIMEOUT_S))
SUBMIT = {"name": "frozen-submit", "dataset": "synthetic", "synthetic_samples": 64,
          "epochs": 1, "nproc_per_node": 1}


class Conn:
    """One kept-alive HTTP/1.1 connection. It never reconnects, so it stays with the API process
    the kernel gave it to (``SO_REUSEPORT``); one that timed out is not used again."""

    def __init__(self, port: int) -> None:
        self.port = port
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def request(
        self, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None,
        timeout_s: float = QUICK_S,
    ) -> tuple[int, dict[str, str], Any, float]:
        """(status, headers, JSON body, seconds taken); status ``NO_ANSWER`` after
        ``timeout_s`` (the connection is then not used again). On a connection already open
        the request is sent in the task's first step, before anything is awaited."""
        started = time.monotonic()
        if self._writer is None:
            self._reader, self._writer = await asyncio.open_connection("127.0.0.1", self.port)
        data = json.dumps(body).encode() if body is not None else b""
        lines = [f"{method} {path} HTTP/1.1", f"Host: 127.0.0.1:{self.port}",
                 *(f"{k}: {v}" for k, v in (headers or {}).items())]
        if method == "POST":
            lines += ["Content-Type: application/json", f"Content-Length: {len(data)}"]
        self._writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
        try:
            status, head, payload = await asyncio.wait_for(self._answer(), timeout_s)
        except TimeoutError:
            status, head, payload = NO_ANSWER, {}, None
        return status, head, payload, time.monotonic() - started

    async def _answer(self) -> tuple[int, dict[str, str], Any]:
        assert self._reader is not None
        head = (await self._reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
        fields = {k.strip().lower(): v.strip() for k, _, v in
                  (line.partition(":") for line in head[1:] if line)}
        payload = await self._reader.readexactly(int(fields.get("content-length", 0)))
        return int(head[0].split(" ", 2)[1]), fields, json.loads(payload) if payload else None

    async def close(self) -> None:
        if self._writer is not None:
            self._writer.close()

    @property
    def local_port(self) -> int:
        assert self._writer is not None, "not connected"
        return self._writer.get_extra_info("sockname")[1]


async def _by_role(port: int, supervisor_conns: int) -> tuple[list[Conn], list[Conn]]:
    """Connections to each API process, told apart by ``/healthz``'s role: (supervisor's,
    standby's), at least ``supervisor_conns`` and 1."""
    sup: list[Conn] = []
    standby: list[Conn] = []
    for _ in range(20):
        batch = [Conn(port) for _ in range(40)]
        answers = await asyncio.gather(*(c.request("GET", "/healthz") for c in batch))
        for conn, (status, _h, body, _s) in zip(batch, answers, strict=True):
            assert status == 200, status
            (sup if body["role"] == "supervisor" else standby).append(conn)
        if len(sup) >= supervisor_conns and standby:
            return sup, standby
    raise AssertionError(f"connections: {len(sup)} to the supervisor, {len(standby)} standby")


def _batch(step: int, *, ballast_from: int | None = None) -> dict:
    """Step ``step``'s loss; with ``ballast_from``, ``BALLAST`` more records (named ``ballast``,
    steps from there on), so that its transaction lasts long enough to be caught in."""
    record = {"attempt": 1, "rank": 0, "epoch": None, "step": step, "time": time.time()}
    records = [{**record, "name": "loss", "value": 1.0 / (step + 1)}]
    if ballast_from is not None:
        records += [{**record, "step": ballast_from + i, "name": "ballast", "value": 0.0}
                    for i in range(BALLAST)]
    return {"records": records}


def _api_process_of(server: LiveServer, conn: Conn) -> int:
    """The pid of the API process serving ``conn`` (its end of the connection)."""
    for proc in psutil.Process(server.proc.pid).children():
        for c in proc.net_connections(kind="tcp"):
            if c.laddr.port == server.port and c.raddr and c.raddr.port == conn.local_port:
                return proc.pid
    raise AssertionError("no API process holds the connection")


def _sqlite_write_lock_holders(db: Path) -> set[int]:
    """The processes holding SQLite's write lock on ``db``: in WAL mode an fcntl lock on byte
    120 of its ``-shm`` file (WALINDEX_LOCK_OFFSET + WAL_WRITE_LOCK), listed in /proc/locks."""
    inode = os.stat(f"{db}-shm").st_ino
    holders = set()
    with open("/proc/locks") as locks:
        for line in locks:
            fields = line.split()
            if fields[1] == "->":
                continue  # a waiter, not a holder
            kind, mode, pid, file, start = fields[1], fields[3], fields[4], fields[5], fields[6]
            if kind == "POSIX" and mode == "WRITE" and start == "120" \
                    and int(file.rsplit(":", 1)[1]) == inode:
                holders.add(int(pid))
    return holders


def _stopped(pid: int) -> None:
    deadline = time.monotonic() + 10
    while psutil.Process(pid).status() != psutil.STATUS_STOPPED:
        assert time.monotonic() < deadline, f"pid {pid} did not stop"
        time.sleep(0.001)


def _freeze_when_holding(db: Path, pid: int, answered: threading.Event) -> bool:
    """SIGSTOP ``pid`` the moment it holds the write lock on ``db``; True if it still does once
    stopped (then it stays frozen), else it is thawed; False if the request was answered first."""
    while not answered.is_set():
        if pid in _sqlite_write_lock_holders(db):
            os.kill(pid, signal.SIGSTOP)
            _stopped(pid)
            if pid in _sqlite_write_lock_holders(db):
                return True
            os.kill(pid, signal.SIGCONT)  # between its lock and our signal it committed
    return False


async def _freeze_inside_a_sqlite_batch(
    db: Path, conn: Conn, pid: int, path: str, auth: dict[str, str],
) -> asyncio.Future:
    """Batches (step 0's loss and ballast) on ``conn`` until its API process ``pid`` is frozen holding
    the write lock inside one; that batch's request, answered once the API process thaws."""
    for attempt in range(CATCH_TRIES):
        answered = threading.Event()
        request = asyncio.ensure_future(conn.request(
            "POST", path, _batch(0, ballast_from=1000 * (attempt + 1)), auth, timeout_s=120))
        request.add_done_callback(lambda _done, answered=answered: answered.set())
        if await asyncio.to_thread(_freeze_when_holding, db, pid, answered):
            return request
        status, _h, body, _s = await request
        assert status == 200, (status, body)
    raise AssertionError(f"the API process was never caught holding the lock in {CATCH_TRIES} batches")


def _record_lock_waits(cur: Any, job_id: int, granted: bool) -> list[int]:
    """Backends holding (``granted``) or waiting for the job's record lock (PostgreSQL)."""
    cur.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND classid = %s "
                "AND objid = %s AND objsubid = 2 AND granted = %s",
                (recordstore._RECORDS_LOCK_CLASS, job_id, granted))
    return [row[0] for row in cur.fetchall()]


async def _freeze_inside_a_postgresql_batch(
    url: str, job_id: int, conn: Conn, pid: int, path: str, auth: dict[str, str],
) -> asyncio.Future:
    """The job's record lock, held here, handed to the API process ``pid`` frozen meanwhile: its batch
    waits for the lock, it is frozen while it waits, the lock is let go, and PostgreSQL grants
    it to the frozen API process's waiting transaction. That batch's request, answered once thawed."""
    import psycopg

    holder = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"))
    watcher = psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"),
                              autocommit=True)
    try:
        holder.execute("SELECT pg_advisory_xact_lock(%s, %s)",
                       (recordstore._RECORDS_LOCK_CLASS, job_id))
        request = asyncio.ensure_future(conn.request("POST", path, _batch(0), auth, timeout_s=120))
        deadline = time.monotonic() + 30
        with watcher.cursor() as cur:
            while not (waiting := _record_lock_waits(cur, job_id, granted=False)):
                assert time.monotonic() < deadline, "the API process's batch never waited for the lock"
                await asyncio.sleep(0.005)
            os.kill(pid, signal.SIGSTOP)  # within its lock wait (LOCK_TIMEOUT_S): it holds on
            await asyncio.to_thread(_stopped, pid)
            holder.rollback()  # the lock goes to the frozen API process's transaction
            while _record_lock_waits(cur, job_id, granted=True) != waiting:
                assert time.monotonic() < deadline, "the lock never went to the frozen API process"
                await asyncio.sleep(0.005)
        return request
    finally:
        holder.close()
        watcher.close()


def _running_job(url: str, slots: int) -> tuple[int, str]:
    """A job as a launched one is (starting, with a token), holding every CPU slot so nothing
    else launches; made in the database, so no torchrun runs (the supervisor, mid-term, leaves
    a job it did not launch alone)."""
    engine = make_engine(url)
    token, digest = new_token()
    try:
        with make_session_factory(engine)() as session:
            spec = JobSpec.model_validate({**SUBMIT, "name": "frozen", "nproc_per_node": 2})
            job = repo.create_job(session, spec)
            assert repo.transition(session, job.id, JobState.starting, token_hash=digest,
                                   started_at=repo.utcnow())
            repo.allocate(session, job.id, [f"cpu:{i}" for i in range(slots)])
            session.commit()
            return job.id, token
    finally:
        engine.dispose()


def _post_until_stored(server: LiveServer, path: str, body: dict, headers: dict[str, str]
                       ) -> httpx.Response:
    """As a client that retries: again after ``Retry-After`` while the answer is 503."""
    deadline = time.monotonic() + 60
    with httpx.Client(base_url=server.url, timeout=30) as c:
        while (r := c.post(path, json=body, headers=headers)).status_code == 503:
            assert r.headers["Retry-After"] == RETRY_AFTER
            assert time.monotonic() < deadline, r.text
            time.sleep(float(r.headers["Retry-After"]))
    return r


@both_stores
def test_a_frozen_api_process_holding_the_lock_stalls_no_other(
    live_server_factory, database_url: str | None, store: str,  # type: ignore[no-untyped-def]
) -> None:
    server: LiveServer = live_server_factory(
        _args=("--workers", "2"),
        TORCHYARD_LEASE_TTL_S="60",  # no takeover while one is frozen: the roles stay put
        TORCHYARD_DB_LOCK_TIMEOUT_S=str(LOCK_TIMEOUT_S),
        TORCHYARD_WARM_RANKS="false",  # no job is launched here: no warm pool to start
    )
    server.await_log("supervises, generation")
    db = server.home / "torchyard.db"
    job_id, token = _running_job(database_url or f"sqlite:///{db}", 4)
    auth = {"Authorization": f"Bearer {token}"}
    records_path = f"/jobs/{job_id}/records"
    answers: dict[str, Any] = {}

    async def freeze_one_and_use_the_other() -> None:
        healthy, standby = await _by_role(server.port, BURST + 4)
        pid = _api_process_of(server, standby[0])
        if database_url is None:
            paused = await _freeze_inside_a_sqlite_batch(db, standby[0], pid, records_path, auth)
        else:
            paused = await _freeze_inside_a_postgresql_batch(
                database_url, job_id, standby[0], pid, records_path, auth)
        try:
            burst = [asyncio.ensure_future(conn.request(
                "POST", records_path, _batch(step), auth, timeout_s=ANSWER_WITHIN_S + 5))
                for step, conn in enumerate(healthy[:BURST], start=1)]
            submit = asyncio.ensure_future(healthy[BURST].request(
                "POST", "/jobs", SUBMIT, {"Idempotency-Key": "frozen-submit"},
                timeout_s=ANSWER_WITHIN_S + 5))
            await asyncio.sleep(0)  # each task's first step: its request is sent
            # The healthy API process has all of them in hand: waiting for slots and for the lock.
            await asyncio.to_thread(await_requests_read, server.port,
                                    [conn.local_port for conn in healthy[:BURST + 1]])
            reads = {}
            paths = ("/healthz", "/jobs", f"/jobs/{job_id}/metrics")
            for conn, path in zip(healthy[BURST + 1:], paths, strict=False):
                reads[path] = await conn.request("GET", path)
            answers["reads"] = reads
            answers["burst"] = await asyncio.gather(*burst)
            answers["submit"] = await submit
        finally:
            os.kill(pid, signal.SIGCONT)
        answers["paused"] = await paused
        for conn in healthy + standby:
            await conn.close()

    asyncio.run(freeze_one_and_use_the_other())

    # The healthy API process answered health checks and reads at once, while more record posts
    # than it has threads waited on the frozen API process's lock.
    for path, (status, _h, _body, took_s) in answers["reads"].items():
        assert status == 200 and took_s < QUICK_S, (path, status, took_s)
    # Writes needing the held lock: 503 with Retry-After, within the bound, none stored.
    for status, head, body, took_s in answers["burst"]:
        assert status == 503, (status, body)
        assert head.get("retry-after") == RETRY_AFTER and body["error"] == "unavailable", head
        assert took_s < ANSWER_WITHIN_S, took_s
    status, head, body, took_s = answers["submit"]
    if store == "sqlite":  # one write lock for the whole file
        assert status == 503 and head.get("retry-after") == RETRY_AFTER, (status, body)
        # The supervisor (the healthy API process) had nothing to write during the freeze, and its
        # loop takes no write lock then (it reads first): it never waited on the frozen one.
        # A loop write meeting a held lock: test_a_write_waits_for_a_held_lock_at_most_its_timeout.
        assert "database busy, retrying" not in server.log.read_text()
    else:  # PostgreSQL: only that job's record lock is held; a submit takes none of it
        assert status == 201, (status, body)
    assert took_s < ANSWER_WITHIN_S, took_s

    # Thawed: the paused batch commits (or, on PostgreSQL, was ended while idle: 503), and a
    # client retrying on 503 lands every batch exactly once.
    status, _h, body, _s = answers["paused"]
    assert status in (200, 503), (status, body)
    if status == 503:
        _post_until_stored(server, records_path, _batch(0), auth)
    for step in range(1, BURST + 1):
        stored = _post_until_stored(server, records_path, _batch(step), auth)
        assert stored.status_code == 200, stored.text
    submitted = _post_until_stored(server, "/jobs", SUBMIT, {"Idempotency-Key": "frozen-submit"})
    assert submitted.status_code in (200, 201), submitted.text
    records = every_record(server, job_id)
    steps = sorted(r["step"] for r in records if r["name"] == "loss")
    assert steps == list(range(BURST + 1)), steps
    with server.client() as c:
        assert len(c.get("/jobs", params={"name": "frozen-submit"}).json()["items"]) == 1
    # The loop went on through the freeze: the thawed submit gets its place in the queue (every
    # slot is held by the frozen job's row) within a few passes.
    deadline = time.monotonic() + 10
    with server.client() as c:
        while c.get(f"/jobs/{submitted.json()['id']}").json()["waiting_reason"] is None:
            assert time.monotonic() < deadline, "the supervisor did not place the thawed submit"
            time.sleep(0.2)
    assert server.proc.poll() is None
    assert asyncio.run(_roles_answering(server.port)) == {"supervisor", "standby"}


async def _roles_answering(port: int) -> set[str]:
    """The roles that answer ``/healthz`` over new connections (both API processes, once thawed)."""
    conns = [Conn(port) for _ in range(20)]
    answers = await asyncio.gather(*(c.request("GET", "/healthz", timeout_s=10) for c in conns))
    for conn in conns:
        await conn.close()
    return {body["role"] for status, _h, body, _s in answers if status == 200}


# --- the pieces ---------------------------------------------------------------------------


def _records(job_id: int) -> list[RecordIn]:
    return [RecordIn(attempt=1, rank=0, epoch=1, step=None, name="loss", value=0.5,
                     time=time.time())]


@both_stores
def test_a_write_waits_for_a_held_lock_at_most_its_timeout(
    tmp_path: Path, database_url: str | None, store: str,
) -> None:
    """The request engine's wait, the loop's shorter one (``with_lock_timeout``), and reads
    that do not wait at all (SQLite WAL) while another connection holds the lock."""
    url = database_url or f"sqlite:///{tmp_path / 'torchyard.db'}"
    upgrade(url)
    engine = make_engine(url, lock_timeout_s=1.0)
    reader = make_engine(url, readonly=True, lock_timeout_s=1.0)
    writes = make_session_factory(engine)
    loop_writes = make_session_factory(with_lock_timeout(engine, 0.3))
    job_id, _token = _running_job(url, 1)
    # Another process's connection, holding the lock as a paused process would.
    if store == "sqlite":
        holder: Any = sqlite3.connect(tmp_path / "torchyard.db", isolation_level=None)
        holder.execute("BEGIN IMMEDIATE")
    else:
        other = make_engine(url)
        holder = other.connect()
        holder.execute(text("SELECT pg_advisory_xact_lock(:c, :j)"),
                       {"c": recordstore._RECORDS_LOCK_CLASS, "j": job_id})
    try:
        for factory, limit_s in ((writes, 1.0), (loop_writes, 0.3)):
            started = time.monotonic()
            with pytest.raises(Exception) as caught, factory() as session:
                assert repo.get_job(session, job_id) is not None
                recordstore.insert_records(session, job_id, _records(job_id))
            took_s = time.monotonic() - started
            assert is_busy(caught.value), caught.value
            assert limit_s * 0.8 <= took_s < limit_s + 1.0, (limit_s, took_s)
        started = time.monotonic()
        with reader.connect() as conn:
            assert repo.job_state(conn, job_id) == "starting"
        assert time.monotonic() - started < 0.5
    finally:
        holder.close()
        if store != "sqlite":
            other.dispose()
    with writes() as session:  # the lock is free again
        assert recordstore.insert_records(session, job_id, _records(job_id)) == 1
        session.commit()
    engine.dispose()
    reader.dispose()


def test_an_idle_postgresql_transaction_is_ended_and_its_locks_freed(
    postgres_server,  # type: ignore[no-untyped-def]
) -> None:
    """A paused process's transaction sits idle: PostgreSQL ends it after three lock timeouts,
    so the job's record lock it held is free again even before the process thaws."""
    url = postgres_server.create_database()
    upgrade(url)
    engine = make_engine(url, lock_timeout_s=0.5)
    job_id, _token = _running_job(url, 1)
    writes = make_session_factory(engine)
    paused = writes()
    recordstore.insert_records(paused, job_id, _records(job_id))  # takes the record lock, then idles
    backend = paused.connection().connection.driver_connection.info.backend_pid
    with engine.connect() as watcher:  # until PostgreSQL ended the idle one (3 lock timeouts)
        deadline = time.monotonic() + 30
        while watcher.execute(text("SELECT count(*) FROM pg_stat_activity WHERE pid = :p"),
                              {"p": backend}).scalar_one():
            assert time.monotonic() < deadline, "the idle transaction was never ended"
            time.sleep(0.05)
            watcher.rollback()  # a fresh snapshot of pg_stat_activity each time
    with writes() as session:  # not blocked: the idle one was ended
        recordstore.insert_records(session, job_id, _records(job_id))
        session.commit()
    with pytest.raises(Exception) as caught:
        paused.commit()
    assert is_busy(caught.value), caught.value
    paused.close()
    engine.dispose()


def test_the_finisher_waits_out_a_busy_database_instead_of_failing_the_job(
    tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    """A job that ended while another process held the write lock ends as its outcome says,
    once the lock is free, not ``failed`` for the finisher's lock wait."""
    db = tmp_path / "torchyard.db"
    upgrade(f"sqlite:///{db}")
    engine = make_engine(f"sqlite:///{db}", lock_timeout_s=0.3)
    job_id, _token = _running_job(f"sqlite:///{db}", 1)
    run = RunDir.for_job(tmp_path / "runs", job_id)
    run.exit_file.parent.mkdir(parents=True)
    run.exit_file.write_text('{"state": "succeeded", "exit_code": 0}')
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    finisher = Finisher(runs_dir=tmp_path / "runs", session_factory=make_session_factory(engine),
                        max_records_per_rank=100)
    finisher.start()
    try:
        finisher.enqueue(job_id, 0)
        deadline = time.monotonic() + 30
        while not [r for r in caplog.records if r.name == "service.domain.loop.finisher"
                   and f"job {job_id}: finishing again" in r.getMessage()]:
            assert time.monotonic() < deadline, "the finisher never met the held lock"
            time.sleep(0.05)
        assert finisher.is_pending(job_id)  # it met the lock, and waits to try again
        holder.execute("ROLLBACK")
        deadline = time.monotonic() + 10
        while finisher.is_pending(job_id):
            assert time.monotonic() < deadline, "not finished once the lock was free"
            time.sleep(0.05)
    finally:
        holder.close()
        finisher.stop()
    with make_session_factory(engine)() as session:
        job = repo.get_job(session, job_id)
        assert job is not None and (job.state, job.reason) == ("succeeded", None)
        assert repo.allocated_resources(session) == {}
    engine.dispose()


def test_sqlite_busy_is_told_from_other_errors() -> None:
    from sqlalchemy.exc import OperationalError

    locked = sqlite3.connect(":memory:")
    try:
        locked.execute("SELECT * FROM missing")
    except sqlite3.OperationalError as exc:
        assert not is_busy(OperationalError("SELECT", None, exc))
    assert not is_busy(ValueError("database is locked"))


def test_the_reporter_waits_as_long_as_retry_after_says(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    answers = iter([
        httpx.Response(503, headers={"Retry-After": "3"}, json={"error": "unavailable"}),
        httpx.Response(503, json={"error": "unavailable"}),  # none: its own backoff
        httpx.Response(503, headers={"Retry-After": "100000"}, json={"error": "unavailable"}),
        httpx.Response(200, json={"accepted": 1, "duplicates": 0}),
    ])
    sent = []

    def answer(request: httpx.Request) -> httpx.Response:
        sent.append(request)
        return next(answers)

    reporter = Reporter(WorkerEnv.from_environ({}))  # no API: no thread of its own
    waits: list[float] = []
    monkeypatch.setattr(reporter._abort, "wait", lambda s: waits.append(s) or False)
    with httpx.Client(transport=httpx.MockTransport(answer)) as client:
        assert reporter._send_batch(client, "http://api/jobs/1/records", [{"name": "loss"}])
    assert len(sent) == 4
    assert waits[0] == 3.0, waits  # Retry-After, not its first backoff step (0.2 s)
    assert waits[1:] == [reporter_module.BACKOFF_START_S * 2, reporter_module.RETRY_AFTER_MAX_S]
    reporter.close()


def test_write_slots_stay_below_the_thread_pool_and_the_pg_pool() -> None:
    from service.store.db import SERVER_POOL_SIZE

    assert 1 <= WRITE_SLOTS < SERVER_POOL_SIZE < 40
