"""A live torchyard server for the benchmarks, and direct database set-up (jobs, bulk records).

``Server.start(home)`` runs the real ``python -m service serve`` on a loopback socket bound
here and handed over (``--fd``: no other program can take the port between the two).
``supervisor=False`` runs ``python -m bench.server HOME FD`` instead: the same app from
``create_app`` under uvicorn, without the supervisor loop, so queued jobs stay queued.
"""

import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Self

import httpx

from service.settings.tokens import new_token

REPO_ROOT = Path(__file__).resolve().parents[1]
START_TIMEOUT_S = 60.0


@dataclass
class Server:
    url: str
    home: Path
    proc: subprocess.Popen[bytes]
    log: Path

    @classmethod
    def start(
        cls, home: Path, *, supervisor: bool = True, env: dict[str, str] | None = None,
        args: tuple[str, ...] = (), program: tuple[str, ...] = ("-m", "service"),
    ) -> "Server":
        """``program``: the ``python`` arguments that run the ``torchyard`` command (a
        benchmark's variant of ``-m service``)."""
        home.mkdir(parents=True, exist_ok=True)
        # SO_REUSEPORT, as `serve --port` opens its own: `serve --fd --workers N` then gives each
        # worker a socket of its own on the port (service.serve.worker_sockets); without it they
        # all accept from this one and a burst of connections lands on one worker.
        sock = socket.create_server(("127.0.0.1", 0), backlog=2048, reuse_port=True)
        port, fd = sock.getsockname()[1], sock.fileno()
        full_env = {
            **os.environ,
            "TORCHYARD_HOME": str(home),
            "TORCHYARD_GPUS": "none",
            "TORCHYARD_CPU_SLOTS": "4",
            "OMP_NUM_THREADS": "1",
            **(env or {}),
        }
        argv = (
            [sys.executable, *program, "serve", "--fd", str(fd), *args]
            if supervisor
            else [sys.executable, "-m", "bench.server", str(home), str(fd)]
        )
        log = home / f"server-{time.time_ns()}.log"
        with sock:  # ours closes once the server has its copy
            proc = subprocess.Popen(
                argv, env=full_env, cwd=REPO_ROOT, stdout=log.open("wb"),
                stderr=subprocess.STDOUT, start_new_session=True, pass_fds=(fd,),
            )
        server = cls(url=f"http://127.0.0.1:{port}", home=home, proc=proc, log=log)
        server._wait_healthy()
        return server

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(f"{self.url}/healthz", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError("server did not answer in time")
            time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.stop()


def wait_job_processes_gone(home: Path, job_id: int, timeout_s: float = 30.0) -> None:
    """Until the job's attempt loop has exited: a job the database calls ended (a cancel is terminal at
    once) still runs for up to the stop grace, and its ranks write in its run directory meanwhile
    (a temp home removed under them fails with ENOTEMPTY). The attempt loop is the job's subreaper and
    stops every process below it before it exits (``service.run.attemptloop``); it is found by the
    pid and start time of the claim it wrote first thing."""
    from service.executor.reference import claim_reference, decode_reference
    from service.run.proctree import same_process
    from torchyard_contract.claim import read_claim
    from torchyard_contract.rundir import RunDir

    reference = claim_reference(read_claim(RunDir.for_job(home / "runs", job_id)) or {})
    loop = decode_reference(reference) if reference is not None else None
    if loop is None:
        return
    deadline = time.monotonic() + timeout_s
    while same_process(*loop):
        if time.monotonic() > deadline:
            raise RuntimeError(f"job {job_id}: its attempt loop (pid {loop[0]}) outlived {timeout_s} s")
        time.sleep(0.05)


def db_path(home: Path) -> Path:
    return (home / "torchyard.db").resolve()


def migrate(home: Path) -> None:
    """Create the schema the way the server does (Alembic), so rows can be loaded before it starts."""
    from service.store.db import upgrade

    home.mkdir(parents=True, exist_ok=True)
    upgrade(f"sqlite:///{db_path(home)}")


BENCH_RANKS = 64  # the largest nproc_per_node: writers may use any rank below it


def insert_running_job(
    home: Path, url: str | None = None, *, adopt_me: bool = False
) -> tuple[int, str]:
    """A running job of ``BENCH_RANKS`` ranks with a known job token, as the supervisor leaves
    a launched one, so the records route takes its batches (a terminal job's are refused). Start
    the server with ``supervisor=False``: its recovery would find no process and end the job;
    or ``adopt_me``: the job's process is this one (the recovery adopts it and it stays running).
    ``url``: the database (default: SQLite under ``home``)."""
    from service.store import repository as repo
    from service.store.db import make_engine, make_session_factory
    from torchyard_contract.spec import JobSpec
    from torchyard_contract.state import JobState

    token, token_hash = new_token()
    engine = make_engine(url or f"sqlite:///{db_path(home)}")
    try:
        with make_session_factory(engine)() as session:
            job = repo.create_job(session, JobSpec(name="bench", nproc_per_node=BENCH_RANKS))
            job.state = JobState.running.value
            job.started_at = job.running_at = repo.utcnow()
            if adopt_me:
                import socket

                from service.executor.reference import NAME, encode_reference
                from service.run.proctree import create_time

                me = os.getpid()
                job.executor = NAME
                job.executor_ref = encode_reference(me, create_time(me), socket.gethostname())
            job.token_hash = token_hash
            job.attempts = []
            session.commit()
            return job.id, token
    finally:
        engine.dispose()


def _record_rows(job_id: int, start: int, count: int) -> Iterator[tuple]:
    now = time.time()
    names = ("loss", "samples", "seconds", "samples_per_s")
    for i in range(start, start + count):
        # One epoch of 4 per-epoch metrics from each of 8 ranks, then steps: unique natural keys.
        yield (job_id, 1, i % 8, i // 32, i // 8 % 4, names[i % 4], float(i), None, now)


def bulk_load_records(home: Path, job_id: int, start: int, count: int) -> None:
    """Append ``count`` records to a job straight through SQL (set-up speed, not the HTTP path)."""
    conn = sqlite3.connect(db_path(home))
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=OFF")
        with conn:
            conn.executemany(
                "INSERT INTO metric_records "
                "(job_id, attempt, rank, epoch, step, name, value, nonfinite, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                _record_rows(job_id, start, count),
            )
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    finally:
        conn.close()


def max_seq(home: Path, job_id: int) -> int:
    conn = sqlite3.connect(db_path(home))
    try:
        return conn.execute(
            "SELECT coalesce(max(seq), 0) FROM metric_records WHERE job_id = ?", (job_id,)
        ).fetchone()[0]
    finally:
        conn.close()


# ``python -m bench.server`` with this set also runs the tracking exporter (the supervisor's
# MLflow and TensorBoard threads, ``service.domain.tracking.exporter``) beside the routes, as
# the supervising process does: bench/tracking.py measures ingestion with and without it.
TRACKING_ENV = "BENCH_TRACKING_EXPORTER"


def _serve_without_supervisor(home: str, fd: int) -> None:
    """The app on the listening socket inherited as ``fd``, without the supervisor loop."""
    import logging

    import uvicorn

    from service.app import create_app
    from service.settings import Settings

    logging.basicConfig(level=logging.WARNING)
    sock = socket.socket(fileno=fd)
    settings = Settings(home=Path(home), port=sock.getsockname()[1])
    app = create_app(settings, run_supervisor=False)
    if os.environ.get(TRACKING_ENV):
        from service.domain.lease import Lease
        from service.domain.tracking.exporter import Exporter

        lease = Lease(app.state.session_factory, settings.lease_ttl_s)
        lease.start()
        Exporter(settings, app.state.session_factory, app.state.read_session_factory, lease,
                 best_trial=lambda _session, _sweep: None).start()
    config = uvicorn.Config(app, log_level="warning")
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    _serve_without_supervisor(sys.argv[1], int(sys.argv[2]))
