"""One supervisor at a time: a lease row in the database that its holder keeps renewing.

Every server process is a candidate; ``Lease.start`` runs a thread that takes or renews the lease
every ``ttl_s / RENEWALS_PER_TTL`` seconds. With TTL = ``lease_ttl_s``:

* **Never two acting at once.** The holder believes it holds the lease until ``t0 + TTL -
  MARGIN_S`` on its own monotonic clock, ``t0`` read *before* the renewing statement is sent; the
  database sets the expiry to *its* clock's now + TTL when the statement runs, which is later. So
  a holder cut off from the database (a partition, a pause) stops acting by itself before anyone
  else can take the lease: ``held()`` turns False first. The supervisor's own writes also check
  the lease inside their transaction (``fence``; share-locked on PostgreSQL, ``BEGIN IMMEDIATE``
  on SQLite), so a write delayed past the expiry changes nothing.
* **Takeover time.** A standby tries every ``TTL / RENEWALS_PER_TTL``: it takes over at most
  ``TTL + TTL / RENEWALS_PER_TTL`` after the holder's last renewal (7 s with the default 6 s
  TTL), at once after a clean stop (the lease is released).
* Expiry is compared on the database's clock only, so hosts with skewed clocks agree.
* A holder on this host whose process is gone (a server SIGKILLed and restarted) is known not to
  act: its lease is taken over at once instead of after its expiry.
* **A renewal never waits long for a lock**: the lease's sessions are the supervisor loop's,
  whose lock waits are short (``service.store.db.with_lock_timeout``); a renewal that meets a lock
  held elsewhere fails and is tried again next round, like one that cannot reach the database.
  On PostgreSQL a frozen holder's fenced transaction is ended by the server (``holds_lease``),
  so a takeover waits at most for that. On SQLite a process frozen *while holding the write
  lock* blocks every renewal and every takeover until it thaws or dies: the holder stops acting
  by itself at its deadline, and no one supervises meanwhile (docs/operations.md).
"""

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field

import psutil
from sqlalchemy.orm import Session, sessionmaker

from service.store import lease as leaserepo
from service.store.db import is_busy

logger = logging.getLogger(__name__)

RENEWALS_PER_TTL = 6
# Stop acting this long before the database could let another candidate in: covers an action
# begun just before ``held()`` turned False, and monotonic clock rate drift.
MARGIN_S = 1.0


def default_owner() -> str:
    """``host:pid:nonce``: unique per process start, and names the host (adoption is per host)."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


@dataclass
class Lease:
    """This process's claim on the supervisor lease.

    The supervisor's loop asks ``held()`` before each pass and recovers first whenever
    ``generation`` is not the one it last recovered under (a new term of leadership).
    """

    session_factory: sessionmaker[Session]
    ttl_s: float
    owner: str = field(default_factory=default_owner)
    host: str = field(default_factory=socket.gethostname)
    clock: Callable[[], float] = time.monotonic
    generation: int | None = None
    _valid_until: float = 0.0
    _acting: bool = False
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    @property
    def renew_s(self) -> float:
        return self.ttl_s / RENEWALS_PER_TTL

    def held(self) -> bool:
        """True while this process may act as the supervisor (see the module docstring)."""
        return self._acting and self.clock() < self._valid_until

    def fence(self, session: Session) -> bool:
        """In a writing transaction: True if it may write as the supervisor (checked in the DB,
        locked against a takeover until the transaction ends)."""
        generation = self.generation
        return (
            self.held()
            and generation is not None
            and leaserepo.holds_lease(session, self.owner, generation, self.ttl_s / 2)
        )

    def renew(self) -> bool:
        """One attempt to take or keep the lease; True if held afterwards."""
        started = self.clock()
        try:
            with self.session_factory() as session:
                generation = leaserepo.claim_lease(session, self.owner, self.host, self.ttl_s)
                if generation is None and (dead := self._dead_local_owner(session)) is not None:
                    generation = leaserepo.take_over(
                        session, dead, self.owner, self.host, self.ttl_s
                    )
                session.commit()
        except Exception as exc:  # unreachable or busy: keep the old deadline, which runs out
            if is_busy(exc):
                logger.warning("lease: renewal failed, the database is busy: %s",
                               getattr(exc, "orig", exc))
            else:
                logger.warning("lease: renewal failed", exc_info=True)
            self._check_lapsed()
            return self.held()
        if generation is None:
            self._lose("another server holds the lease")
            return False
        if not self._acting or generation != self.generation:
            logger.info("lease: this server (%s) supervises, generation %s", self.owner, generation)
        self.generation = generation
        self._valid_until = started + self.ttl_s - MARGIN_S
        self._acting = True
        return self.held()

    def _dead_local_owner(self, session: Session) -> str | None:
        """The holder's owner string if it is a process of this host that no longer exists."""
        row = leaserepo.lease_row(session)
        if row is None or row.owner is None or row.host != self.host:
            return None
        host, _, rest = row.owner.partition(":")
        pid = rest.partition(":")[0]
        if host != self.host or not pid.isdigit() or int(pid) == os.getpid():
            return None
        return None if psutil.pid_exists(int(pid)) else row.owner

    def _check_lapsed(self) -> None:
        if self._acting and self.clock() >= self._valid_until:
            self._lose("could not renew the lease in time")

    def _lose(self, why: str) -> None:
        if not self._acting:
            return
        self._acting = False
        logger.warning("lease: this server (%s) stops supervising: %s", self.owner, why)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="torchyard-lease", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.renew()
            except Exception:  # nothing may end the thread
                logger.exception("lease: renewal round failed")
            self._stop.wait(self.renew_s)

    def stop(self, release: bool = True) -> None:
        """Stop renewing; ``release`` gives the lease up so a standby takes over at once."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        was_acting = self._acting
        self._acting = False
        if release and was_acting:
            try:
                with self.session_factory() as session:
                    leaserepo.release_lease(session, self.owner)
                    session.commit()
            except Exception:
                logger.warning("lease: could not release; it expires by itself", exc_info=True)
