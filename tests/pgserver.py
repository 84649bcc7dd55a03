"""A throwaway PostgreSQL server for tests: ``initdb`` + ``pg_ctl`` in a temp dir, stopped by pid.

The cluster lives in a temp dir owned by the ``postgres`` user when the tests run as root
(PostgreSQL refuses to run as root); its socket is in that dir and it also listens on
127.0.0.1 on a free port. PostgreSQL takes its port from its configuration, so the port is found
free first and may be taken by another program before the server binds it: then the server
exits saying so, and is started again on another free port (``PORT_TRIES`` times in all).
``fsync=off``: a test cluster never needs to survive a power cut.
Each test gets its own database (``create_database``), so tests never see each other's rows.
"""

import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

START_TIMEOUT_S = 30
STOP_TIMEOUT_S = 15
# Every live server opens two pools (writer, reader); tests may run several servers on one DB.
MAX_CONNECTIONS = 300
PORT_TRIES = 3
# What the server's log says when its port was bound by another program first.
PORT_TAKEN = "Address already in use"


def find_bindir() -> Path | None:
    """Directory holding ``initdb`` and ``pg_ctl``: Debian's newest versioned one, else PATH."""
    candidates = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parts[-3]) if Path(p).parts[-3].isdigit() else 0,
    )
    if candidates:
        return Path(candidates[-1]).parent
    found = shutil.which("initdb")
    return Path(found).parent if found else None


@dataclass
class PgServer:
    root: Path
    port: int
    pid: int
    log: Path
    _template: str | None = None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{dbname}"

    def create_database(self, template: str | None = None) -> str:
        """A new database, empty or a copy of ``template``; returns its SQLAlchemy URL."""
        import psycopg  # the ``postgres`` extra; checked by the session fixture

        name = f"t_{uuid.uuid4().hex[:16]}"
        copy = f' TEMPLATE "{template}"' if template else ""
        with psycopg.connect(self._dsn("postgres"), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"{copy}')
        return self.url(name)

    def migrated_template(self) -> str:
        """The name of a database at the migrations' head, made on first use; nobody may stay
        connected to it (``CREATE DATABASE … TEMPLATE`` refuses a template in use)."""
        if self._template is None:
            from service.store.db import upgrade

            url = self.create_database()
            upgrade(url)  # its engine is disposed: no connection stays open
            self._template = url.rsplit("/", 1)[1]
        return self._template

    def _dsn(self, dbname: str) -> str:
        return f"host=127.0.0.1 port={self.port} user=postgres dbname={dbname}"

    def stop(self) -> None:
        """Fast shutdown (SIGINT to the postmaster), then SIGKILL if it lingers; removes the dir."""
        try:
            os.kill(self.pid, signal.SIGINT)
            deadline = time.monotonic() + STOP_TIMEOUT_S
            while _alive(self.pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _alive(self.pid):
                os.kill(self.pid, signal.SIGKILL)  # its backends exit with it
        except ProcessLookupError:
            pass
        shutil.rmtree(self.root, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie child of ours (pg_ctl started it detached, so normally not) counts as gone.
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _as_postgres(argv: list[str]) -> list[str]:
    """Run as the ``postgres`` user when we are root (PostgreSQL refuses root)."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", "postgres", "--", *argv]


def free_port() -> int:
    """A port nobody listens on now (the server binds it later: see the module's docstring)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(bindir: Path, port: int | None = None) -> PgServer:
    """initdb + pg_ctl start on ``port``, else on a free port (another, if that one is taken
    before the server binds it); raises RuntimeError with the server log on failure."""
    root = Path(tempfile.mkdtemp(prefix="torchyard-pg-"))
    if os.geteuid() == 0:
        pw = pwd.getpwnam("postgres")
        os.chown(root, pw.pw_uid, pw.pw_gid)
    data, log = root / "data", root / "server.log"
    subprocess.run(
        _as_postgres([str(bindir / "initdb"), "-D", str(data), "-U", "postgres",
                      "--auth=trust", "-E", "UTF8", "--no-sync"]),
        check=True, capture_output=True, timeout=START_TIMEOUT_S,
    )
    tries = 1 if port is not None else PORT_TRIES
    for attempt in range(1, tries + 1):
        chosen = port if port is not None else free_port()
        error = _pg_ctl_start(bindir, root, chosen)
        if error is None:
            pid = int((data / "postmaster.pid").read_text().split()[0])
            return PgServer(root=root, port=chosen, pid=pid, log=log)
        if PORT_TAKEN not in error or attempt == tries:
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(f"PostgreSQL did not start:\n{error[-3000:]}")
        log.unlink(missing_ok=True)  # port {chosen} was taken meanwhile: again on another
    raise AssertionError("unreachable")


def _pg_ctl_start(bindir: Path, root: Path, port: int) -> str | None:
    """Start the server of ``root`` on ``port``; None once it runs, else the server's log."""
    data, log = root / "data", root / "server.log"
    options = (
        f"-p {port} -k {root} -c listen_addresses=127.0.0.1 -c fsync=off "
        f"-c synchronous_commit=off -c full_page_writes=off -c max_connections={MAX_CONNECTIONS}"
    )
    done = subprocess.run(
        _as_postgres([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
                      "-w", "-t", str(START_TIMEOUT_S), "start"]),
        capture_output=True, timeout=START_TIMEOUT_S + 5, check=False,
    )
    if done.returncode == 0:
        return None
    return log.read_text() if log.exists() else done.stderr.decode()
