"""What ``POST /jobs`` goes through after its schema: admission, what this executor can run,
capacity, the script, its package and its secrets' names as the caller's team may use them, a
job it resumes from (the caller's team's), the idempotency key; then the job is queued as the
caller's (``owner``, ``team``).

Contract: :meth:`Intake.submit` stores a queued job and returns ``(job, created)``, or raises
:class:`SubmitRejected` (its ``kind`` and ``status`` say why), ``AdmissionRefused`` (403) or
``PathRefused`` (422) from ``service.domain.intake.admission``. It never starts anything: the
supervisor's loop does, on its next pass.

There is one way a job is made: every job, a sweep's trials too, is checked by :meth:`Intake.vet`
(admission, the disk floor, what this server can run, the script, its package and its secrets'
names, the ``notify`` endpoints, ``resume_from``) and stored by :meth:`Intake.make`
(``submit`` adds the idempotency key and its own transaction). A sweep's base spec is vetted when
the sweep is created, each trial's spec when the trial is made (``service.domain.sweeps``).
"""

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from service.domain.files.diskspace import DiskFull, check_floor
from service.domain.files.packages import package_store
from service.domain.identity.caller import ADMIN, Caller
from service.domain.intake import secretstore
from service.domain.intake.admission import admit
from service.domain.intake.scriptpath import (
    ScriptRefused,
    ScriptsDisabled,
    package_program,
    script_program,
)
from service.domain.intake.secretstore import SecretRefused
from service.domain.queue.inventory import Inventory
from service.domain.queue.placement import capacity_shortfall, resource_kind
from service.domain.queue.quota import TeamRules
from service.domain.tracking import enrolment as tracking
from service.settings import Settings
from service.settings import webhookfile as webhookconf
from service.store import identity as identitystore
from service.store import repository as repo
from service.store.tables import Job
from torchyard_contract.spec import SLURM_FIELDS, JobSpec


class SubmitRejected(Exception):
    """A spec that is valid on its own but cannot be accepted here (``kind`` says why)."""

    def __init__(self, kind: str, message: str, status: int = 422) -> None:
        super().__init__(message)
        self.kind, self.status = kind, status


def check_local(spec: JobSpec, inventory: Inventory) -> None:
    """Refuse what this host can never run: several nodes, fields only a cluster executor reads,
    more GPUs or slots than it has (422, naming the field and why)."""
    if spec.nnodes > 1:
        raise SubmitRejected(
            "unschedulable",
            f"nnodes: {spec.nnodes} nodes need the slurm executor (TORCHYARD_EXECUTOR=slurm); "
            "this server's local executor runs each job on this one host (nnodes 1)",
        )
    for name in SLURM_FIELDS:
        if getattr(spec, name) is not None:
            raise SubmitRejected(
                "invalid_request",
                f"{name}: only the slurm executor reads it; this server runs jobs locally",
            )
    kind = resource_kind(spec.device.value, inventory)
    shortfall = capacity_shortfall(kind, spec.nproc_per_node, inventory)
    if shortfall is not None:
        raise SubmitRejected("unschedulable", shortfall)


class Vetted(NamedTuple):
    """A spec every check accepted (as admitted: resolved paths) and the webhook endpoints its
    ``notify`` names subscribe (endpoint name → events; None = none)."""

    spec: JobSpec
    webhooks: dict[str, list[str]] | None


@dataclass
class Intake:
    settings: Settings
    sessions: sessionmaker[Session]
    inventory: Inventory
    # True when the executor queues and places jobs itself (a job too big for the cluster is
    # then refused by it); False: this host's limits are checked here.
    executor_queues_jobs: bool
    queued: Callable[[], None]  # wakes the loop
    # Read-only sessions (no write lock on SQLite): what a check reads that may run inside a
    # writer's open transaction (a sweep's trial is made in the driver's) reads through these.
    read_sessions: sessionmaker[Session] | None = None

    def submit(
        self, spec: JobSpec, idempotency_key: str | None = None, caller: Caller = ADMIN,
    ) -> tuple[Job, bool]:
        """Store a queued job of ``caller`` (its ``owner`` and ``team``); returns (job, created).

        A repeated ``idempotency_key`` returns the job first stored with it (``created`` False),
        so a retried request never launches twice; the same key with a different spec, or from
        another user, raises ``SubmitRejected("idempotency_conflict")``. Also raises
        ``SubmitRejected`` for a job that can never fit this host or names a job, package or
        secret that does not exist for the caller's team.
        """
        spec = admit(spec, self.settings)  # 403 script jobs without tokens; 422 paths outside roots
        self.check_floor()
        if idempotency_key is not None:
            existing = self._job_for_key(idempotency_key, spec, caller)
            if existing is not None:
                return existing, False
        with self.sessions() as session:
            vetted = self._vet_admitted(session, spec, caller)
            try:
                job = self._store(session, vetted, idempotency_key, caller)
                session.commit()
            except IntegrityError:
                # Another request with the same key won the race between lookup and insert.
                session.rollback()
                existing = self._job_for_key(idempotency_key or "", spec, caller)
                if existing is None:
                    raise
                return existing, False
        self.queued()
        return job, True

    def vet(self, session: Session, spec: JobSpec, caller: Caller = ADMIN) -> Vetted:
        """Every check a submitted spec gets (the module docstring), nothing stored; raises as
        :meth:`submit` does. ``session`` reads the job ``resume_from`` names."""
        spec = admit(spec, self.settings)
        self.check_floor()
        return self._vet_admitted(session, spec, caller)

    def make(self, session: Session, spec: JobSpec, caller: Caller = ADMIN) -> Job:
        """A queued job of ``spec`` for ``caller`` in the caller's transaction (which commits
        it), after every check of :meth:`vet`: how a sweep's driver makes each trial (as the
        sweep's owner and team)."""
        return self._store(session, self.vet(session, spec, caller), None, caller)

    def check_floor(self) -> None:
        """Raise ``SubmitRejected`` (507, ``insufficient_storage``) below the disk floor."""
        try:
            check_floor(self.settings)
        except DiskFull as exc:
            raise SubmitRejected("insufficient_storage", str(exc), status=507) from exc

    def _vet_admitted(self, session: Session, spec: JobSpec, caller: Caller) -> Vetted:
        self.check_team(spec, caller)
        self.check_runnable(spec, caller)
        try:  # names only; URLs and secrets are read when each delivery is sent
            webhooks = webhookconf.subscriptions(spec.notify, self.settings.webhooks_file)
        except webhookconf.NotifyRefused as exc:
            raise SubmitRejected("invalid_request", f"notify: {exc}") from exc
        if spec.resume_from is not None:
            resumed = repo.get_job(session, spec.resume_from)
            if resumed is None or not caller.sees(resumed.team):  # its checkpoints are its team's
                raise SubmitRejected("invalid_request",
                                     f"resume_from: job {spec.resume_from} not found")
        return Vetted(spec, webhooks)

    def _store(
        self, session: Session, vetted: Vetted, idempotency_key: str | None, caller: Caller,
    ) -> Job:
        """The one insert of a job (``repository.create_job``), after :meth:`_vet_admitted`."""
        job = repo.create_job(session, vetted.spec, idempotency_key, vetted.webhooks,
                              owner=caller.user, team=caller.team)
        tracking.enrol_job(session, self.settings, job, vetted.spec)  # its export, if any
        return job

    def check_team(self, spec: JobSpec, caller: Caller) -> None:
        """What the caller's team allows (docs/scheduling.md, "Teams"): a member submits at most
        at its ``max_priority`` (admins at any); on this host a job that is not preemptible
        needs at most its ``max_slots`` (a preemptible one may run on borrowed slots); a member
        charges its ``slurm_account`` and ``slurm_qos``, not another. 422 naming the field.
        Reads the team through the read-only sessions: it may run inside a writer's open
        transaction (a sweep's trial), where a second writer session would wait on the first."""
        if caller.team is None:
            return
        with (self.read_sessions or self.sessions)() as session:
            team = identitystore.get_team(session, caller.team)
        if team is None:
            return
        if not caller.admin and spec.priority > team.max_priority:
            raise SubmitRejected("invalid_request", f"priority: {spec.priority} is above team "
                                 f"{team.name}'s max_priority {team.max_priority}")
        rules = TeamRules.of(team.name, team.quota, team.share)
        slots = spec.nproc_per_node * spec.nnodes
        if (not self.executor_queues_jobs and rules.max_slots is not None and not spec.preemptible
                and slots > rules.max_slots):
            raise SubmitRejected("unschedulable", f"nproc_per_node: needs {slots} slots; team "
                                 f"{team.name}'s quota is max_slots {rules.max_slots} (a "
                                 "preemptible job may borrow idle slots past it)")
        if caller.admin:
            return
        for field, own in (("account", team.slurm_account), ("qos", team.slurm_qos)):
            asked = getattr(spec, field)
            if own is not None and asked is not None and asked != own:
                raise SubmitRejected("invalid_request", f"{field}: team {team.name}'s jobs are "
                                     f"charged to slurm_{field} {own}, not {asked}")

    def check_runnable(self, spec: JobSpec, caller: Caller = ADMIN) -> None:
        """Raise ``SubmitRejected`` for an admitted spec this server could never run for
        ``caller`` (also the check of a sweep's trials, ``service.domain.sweeps.manage``)."""
        if not self.executor_queues_jobs:
            check_local(spec, self.inventory)
        refused = tracking.refusal(spec, self.settings)
        if refused is not None:
            raise SubmitRejected("invalid_request", refused)
        if spec.is_script:  # refuse what could never launch; resolved again at launch
            self._check_script(spec, caller)

    def _check_script(self, spec: JobSpec, caller: Caller) -> None:
        try:
            if spec.package is not None:
                self._check_package(spec, spec.package, caller)
            else:
                script_program(spec, self.settings.script_dir_list)
        except ScriptsDisabled as exc:
            raise SubmitRejected("scripts_disabled", str(exc), status=403) from exc
        except ScriptRefused as exc:
            raise SubmitRejected("invalid_request", str(exc)) from exc
        try:  # names only; values are read at launch
            secretstore.check_names(spec.secret_env, self.settings.secrets_file, caller.team)
        except SecretRefused as exc:
            raise SubmitRejected("invalid_request", str(exc)) from exc

    def _check_package(self, spec: JobSpec, digest: str, caller: Caller) -> None:
        if not self.settings.packages_enabled:
            raise SubmitRejected(
                "packages_disabled", "package: packages are turned off on this server "
                "(TORCHYARD_PACKAGES_ENABLED=false)", status=403)
        store = package_store(self.settings)
        if not self.package_visible(digest, caller) or store.get(digest) is None:
            raise SubmitRejected(
                "invalid_request", f"package: {digest} is not on this server; upload it with "
                "POST /packages first")
        package_program(spec, store.tree(digest))  # the entrypoint exists inside it

    def package_visible(self, digest: str, caller: Caller) -> bool:
        """Whether ``caller``'s team uploaded ``digest`` (admins see every package)."""
        if caller.admin:
            return True
        if caller.team is None:
            return False
        with self.sessions() as session:
            return identitystore.package_granted(session, digest, caller.team)

    def _job_for_key(self, key: str, spec: JobSpec, caller: Caller) -> Job | None:
        with self.sessions() as session:
            job = repo.job_by_idempotency_key(session, key)
        if job is not None and (job.owner, job.team) != (caller.user, caller.team):
            raise SubmitRejected(  # never another user's job, not even its id
                "idempotency_conflict", "Idempotency-Key: already used by another user",
                status=409)
        if job is not None and job.spec != spec.model_dump(mode="json"):
            raise SubmitRejected(
                "idempotency_conflict",
                f"Idempotency-Key: already used for job {job.id} with a different spec",
                status=409,
            )
        return job
