"""Talking to Slurm through its stable commands: ``sbatch --parsable``, ``squeue -h -o``,
``scontrol show job -o``, ``scancel``, ``sinfo -h -o`` and ``sacct -P`` (when there is
accounting or a job-completion log).

Never ``--json``: its shape changes between releases (and on 22.05 ``squeue --json`` ignores
``-j``/``-t``). Every format here is a fixed ``|``-separated field list whose parsing is a pure
function, unit-tested on captured output. A command that fails or times out raises
``SlurmError``; a query about jobs Slurm no longer knows is not an error (an empty answer).

Each command runs by the absolute path found once, when ``SlurmCli`` is made, in
``TORCHYARD_SLURM_BIN_DIR`` or on the server's own ``PATH``, with the server's own environment
(less its secrets): nothing of a job's can choose the program or steer it. Each runs in a session
of its own with a timeout; one that does not answer in time is killed with everything it started
(``SlurmTimeout``).
"""

import contextlib
import os
import re
import shutil
import signal
import subprocess
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from service.executor.base import ExecutorError, NodeRow

COMMAND_TIMEOUT_S = 30.0
# After a timeout: how long the killed command's output pipes may take to close.
KILL_WAIT_S = 5.0
# The commands torchyard runs on the server's host (srun runs inside the job, on its nodes).
PROGRAMS = ("sbatch", "squeue", "scontrol", "scancel", "sinfo", "sacct")
SEP = "|"
# squeue: job id, state, reason, batch host, node list.
SQUEUE_FORMAT = SEP.join(("%i", "%T", "%r", "%B", "%N"))
# sinfo, one line per node and partition: node, its host name, state, CPUs as
# allocated/idle/other/total, GRES, partition.
SINFO_FORMAT = SEP.join(("%N", "%n", "%T", "%C", "%G", "%P"))
SACCT_FIELDS = "JobIDRaw,State,ExitCode"

PENDING_STATES = frozenset({
    "PENDING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
})
# Ended for good: nothing of the job runs any more.
TERMINAL_STATES = frozenset({
    "COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL",
    "DEADLINE", "OUT_OF_MEMORY", "REVOKED",
})
# Anything else (RUNNING, CONFIGURING, COMPLETING, SUSPENDED, STOPPED, SIGNALING, STAGE_OUT,
# RESIZING, and states a later release adds) counts as running: processes may still be alive.


class SlurmError(ExecutorError):
    """A Slurm command failed (not found, timed out, or exited non-zero for another reason)."""


class SlurmTimeout(SlurmError):
    """A Slurm command did not answer within its timeout; it was killed (its whole session)."""


@dataclass(frozen=True)
class QueueRow:
    job_id: str
    state: str  # Slurm's, e.g. PENDING, RUNNING, COMPLETED
    reason: str | None  # why it is pending ("Resources", "Priority"); None when Slurm says None
    batch_host: str | None
    nodes: str | None

    @property
    def pending(self) -> bool:
        return self.state in PENDING_STATES

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


def _none(value: str) -> str | None:
    value = value.strip()
    return None if value in ("", "None", "(null)", "n/a") else value


def parse_squeue(text: str) -> dict[str, QueueRow]:
    """Rows of ``squeue -h -o SQUEUE_FORMAT``, by job id. Lines of another shape are skipped
    (a warning a release prints); the last field may hold ``|`` only if Slurm ever put one in a
    node list, so it takes the rest of the line."""
    rows: dict[str, QueueRow] = {}
    for line in text.splitlines():
        parts = line.strip().split(SEP, 4)
        if len(parts) != 5 or not re.fullmatch(r"\d+(_\d+)?", parts[0]):
            continue
        job_id, state, reason, host, nodes = parts
        state = state.strip().upper().split()[0] if state.strip() else "UNKNOWN"
        rows[job_id] = QueueRow(job_id, state, _none(reason), _none(host), _none(nodes))
    return rows


_SCONTROL_KEY = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_scontrol_record(line: str) -> dict[str, str]:
    """One ``scontrol show job -o`` line → ``{key: value}``. Values may hold ``=`` and spaces
    (``Command=/a b``, ``TRES=cpu=2,node=2``): a value runs up to the next `` Key=``."""
    fields: dict[str, str] = {}
    matches = list(_SCONTROL_KEY.finditer(line))
    for i, m in enumerate(matches):
        end = matches[i + 1].start() if i + 1 < len(matches) else len(line)
        fields.setdefault(m.group(1), line[m.end():end].strip())
    return fields


def parse_exit_code(value: str | None) -> tuple[int, int] | None:
    """Slurm's ``ExitCode=<code>:<signal>`` → (code, signal); None when absent or malformed."""
    m = re.fullmatch(r"\s*(\d+):(\d+)\s*", value or "")
    return (int(m.group(1)), int(m.group(2))) if m else None


def parse_sinfo(text: str) -> list[NodeRow]:
    """Rows of ``sinfo -h -N -o SINFO_FORMAT``; the default partition's ``*`` and the state's
    flag suffixes (``*`` not responding, ``~`` powered off, …) are dropped."""
    rows = []
    for line in text.splitlines():
        parts = line.strip().split(SEP)
        if len(parts) != 6 or not parts[0]:
            continue
        name, host, state, cpus, gres, partition = (p.strip() for p in parts)
        counts = cpus.split("/")  # allocated/idle/other/total
        if len(counts) != 4 or not all(c.isdigit() for c in counts):
            continue
        rows.append(NodeRow(name, host, state.rstrip("*~#!%$@^-+"), int(counts[0]),
                            int(counts[3]), _none(gres), partition.rstrip("*")))
    return rows


def parse_sacct(text: str) -> dict[str, tuple[str, tuple[int, int] | None]]:
    """``sacct -P -n -X -o SACCT_FIELDS`` → job id → (state, exit code). ``CANCELLED by 0`` →
    ``CANCELLED``. A job listed twice (requeued) keeps its last line."""
    found: dict[str, tuple[str, tuple[int, int] | None]] = {}
    for line in text.splitlines():
        parts = line.strip().split(SEP)
        if len(parts) != 3 or not parts[0].isdigit():
            continue
        state = parts[1].split()[0] if parts[1].strip() else "UNKNOWN"
        found[parts[0]] = (state, parse_exit_code(parts[2]))
    return found


def find_programs(search_path: str) -> dict[str, str]:
    """Absolute paths of ``PROGRAMS`` found on ``search_path`` (``PATH`` syntax); a relative
    entry is taken from the current directory now, never later."""
    found = {}
    for name in PROGRAMS:
        where = shutil.which(name, path=search_path)
        if where is not None:
            found[name] = os.path.abspath(where)
    return found


@dataclass(frozen=True)
class SlurmCli:
    """Runs Slurm's client commands. ``env``: their environment (the server's own, less its
    secrets, with ``SLURM_CONF`` if it has one); ``bin_dir``: where they are, None = on the
    ``PATH`` of ``env``; ``timeout_s``: how long one command may take."""

    env: Mapping[str, str]
    bin_dir: str | None = None
    timeout_s: float = COMMAND_TIMEOUT_S
    programs: Mapping[str, str] = field(init=False)  # name → absolute path, found once

    def __post_init__(self) -> None:
        object.__setattr__(self, "env", dict(self.env))
        object.__setattr__(self, "programs", find_programs(self._search_path))

    @property
    def _search_path(self) -> str:
        return self.bin_dir if self.bin_dir else self.env.get("PATH", os.defpath)

    def program(self, name: str) -> str:
        """The absolute path of Slurm's ``name`` command; ``SlurmError`` when it was not found."""
        try:
            return self.programs[name]
        except KeyError:
            raise SlurmError(
                f"{name}: not found in {self._search_path!r} (the server's PATH, or "
                "TORCHYARD_SLURM_BIN_DIR)"
            ) from None

    def run(
        self, argv: Sequence[str], *, env: Mapping[str, str] | None = None, ok_codes=(0,),
        pass_fds: Sequence[int] = (),
    ) -> subprocess.CompletedProcess[str]:
        """``argv[0]`` is a command's name (``sbatch``) or the absolute path found for it; it
        runs by that path. ``env``: instead of ``self.env`` (``sbatch``: a smaller one)."""
        found = argv[0] if argv[0] in self.programs.values() else self.program(argv[0])
        command, name = [found, *argv[1:]], os.path.basename(found)
        try:
            proc = subprocess.Popen(
                command, env=dict(env if env is not None else self.env), text=True,
                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                start_new_session=True, pass_fds=tuple(pass_fds),
            )
        except OSError as exc:
            raise SlurmError(f"{name}: {exc}") from exc
        try:
            out, err = proc.communicate(timeout=self.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_session(proc)
            raise SlurmTimeout(
                f"{name} did not answer within {self.timeout_s:g} s (killed)"
            ) from None
        except BaseException:
            _kill_session(proc)
            raise
        if proc.returncode not in ok_codes:
            lines = (err or out).strip().splitlines()
            raise SlurmError(f"{name} exited {proc.returncode}: {lines[-1] if lines else ''}")
        return subprocess.CompletedProcess(command, proc.returncode, out, err)

    def sbatch(
        self, argv: Sequence[str], env: Mapping[str, str], pass_fds: Sequence[int] = ()
    ) -> str:
        """Submit (``argv`` from ``build_sbatch_command``); the new job's id. ``env``: sbatch's
        own environment, made of the server's (``slurmscript.sbatch_environment``), never of the
        job's; the job's environment travels in the export file (``export_fd``, in
        ``pass_fds``)."""
        out = self.run(argv, env=env, pass_fds=pass_fds).stdout.strip()
        job_id = out.split(";")[0]
        if not job_id.isdigit():
            raise SlurmError(f"sbatch printed no job id: {out!r}")
        return job_id

    def find(self, name: str, work_dir: str) -> dict[str, QueueRow]:
        """Every job Slurm still lists (finished ones included) named ``name`` whose working
        directory is ``work_dir``: how a submit whose ``sbatch`` timed out is found."""
        proc = self.run(["squeue", "-h", "-t", "all", "-n", name, "-o", SQUEUE_FORMAT + SEP + "%Z"])
        rows = {}
        for line in proc.stdout.splitlines():
            head, _, directory = line.strip().rpartition(SEP)
            if directory == work_dir:
                rows.update(parse_squeue(head))
        return rows

    def squeue(self, job_ids: Iterable[str]) -> dict[str, QueueRow]:
        """Every listed job Slurm still knows, finished ones included, in one call. Jobs it has
        purged are simply absent (squeue exits 1 with "Invalid job id" when it knows none)."""
        ids = sorted(set(job_ids), key=int)
        if not ids:
            return {}
        proc = self.run(
            ["squeue", "-h", "-t", "all", "-j", ",".join(ids), "-o", SQUEUE_FORMAT],
            ok_codes=(0, 1),
        )
        if proc.returncode == 1:
            if "invalid job id" in proc.stderr.lower():
                return {}
            raise SlurmError(f"squeue exited 1: {proc.stderr.strip()}")
        return parse_squeue(proc.stdout)

    def show_job(self, job_id: str) -> dict[str, str] | None:
        """``scontrol show job -o``; None when Slurm no longer knows the job."""
        proc = self.run(["scontrol", "show", "job", "-o", job_id], ok_codes=(0, 1))
        if proc.returncode == 1:
            if "invalid job id" in proc.stderr.lower():
                return None
            raise SlurmError(f"scontrol exited 1: {proc.stderr.strip()}")
        line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("JobId=")), None)
        return parse_scontrol_record(line) if line else None

    def sacct(self, job_id: str) -> tuple[str, tuple[int, int] | None] | None:
        """(state, exit code) from accounting, or from the job-completion log (``-c``) where
        there is no accounting database; None when neither knows the job."""
        for extra in ([], ["-c"]):
            try:
                proc = self.run(
                    ["sacct", *extra, "-P", "-n", "-X", "-j", job_id, "-o", SACCT_FIELDS]
                )
            except SlurmError:
                continue
            found = parse_sacct(proc.stdout).get(job_id)
            if found is not None:
                return found
        return None

    def scancel(self, job_id: str, *, signal: str | None = None, batch_only: bool = False) -> None:
        """Cancel (or only signal) a job; a job Slurm no longer knows is not an error."""
        argv = ["scancel", "--quiet"]
        if signal is not None:
            argv.append(f"--signal={signal}")
        if batch_only:
            argv.append("--batch")
        self.run([*argv, job_id], ok_codes=(0, 1))

    def sinfo(self, partition: str | None) -> list[NodeRow]:
        argv = ["sinfo", "-h", "-N", "-o", SINFO_FORMAT]
        if partition is not None:
            argv += ["-p", partition]
        return parse_sinfo(self.run(argv).stdout)


def _kill_session(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the command and every process of its session (it has its own), then reap it; its
    output pipes are closed once nothing holds them (or after ``KILL_WAIT_S``)."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    try:
        proc.communicate(timeout=KILL_WAIT_S)
    except subprocess.TimeoutExpired:  # something left the session and holds a pipe
        for pipe in (proc.stdout, proc.stderr):
            if pipe is not None:
                pipe.close()
        proc.wait()


@contextlib.contextmanager
def export_fd(content: bytes) -> Iterator[int]:
    """A file descriptor to hand ``sbatch --export-file=<fd>`` (via ``pass_fds``): an anonymous
    in-memory file (``memfd``) holding ``content``, read from its start. It has no name on any
    filesystem, so the job's variables (its token, its secrets) are never in a file another user
    could read, nor on a command line."""
    fd = os.memfd_create("torchyard-job-env")
    try:
        view = memoryview(content)
        while view:
            view = view[os.write(fd, view):]
        os.lseek(fd, 0, os.SEEK_SET)
        yield fd
    finally:
        os.close(fd)
