"""A real Slurm 22.05 cluster of two emulated nodes on this host, for tests and the bench.

``SlurmCluster.start(root)`` writes ``slurm.conf`` into ``root`` and starts ``munged`` (its own
key and socket), ``slurmctld`` and two ``slurmd`` (``-N n1`` / ``-N n2`` on distinct ports);
``stop()`` cancels what is left in the queue and stops each daemon by the pid it wrote. Nothing
outside ``root`` is touched; the host's own munge and Slurm (if any) are left alone.

The configuration follows what was measured on the CI machine class: no cgroups
(``proctrack/linuxproc``, ``task/none``), no accounting database (``jobcomp/filetxt``, so
``sacct -c`` still reads finished jobs), no scheduling delay, and a short ``MinJobAge`` so a
test can watch Slurm forget a finished job.
"""

import getpass
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

PROGRAMS = ("munged", "slurmctld", "slurmd", "sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
NODES = ("n1", "n2")
CPUS_PER_NODE = 2
PARTITION = "debug"
START_TIMEOUT_S = 30.0
PORT_TRIES = 3
PORT_TAKEN = "Address already in use"  # what a daemon logs when its port was bound first
STOP_GRACE_S = 5.0


def missing_programs() -> list[str]:
    """Slurm and munge programs this host lacks (empty: a cluster can be started)."""
    found = [shutil.which(p) or shutil.which(p, path="/usr/sbin:/sbin") for p in PROGRAMS]
    return [p for p, f in zip(PROGRAMS, found, strict=True) if f is None]


def _program(name: str) -> str:
    path = shutil.which(name) or shutil.which(name, path="/usr/sbin:/sbin")
    if path is None:
        raise FileNotFoundError(name)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def slurm_conf(root: Path, ctld_port: int, node_ports: dict[str, int], user: str) -> str:
    """The cluster's ``slurm.conf``; pure."""
    host = socket.gethostname()
    nodes = "\n".join(
        f"NodeName={name} NodeHostname={host} NodeAddr=127.0.0.1 Port={port} "
        f"CPUs={CPUS_PER_NODE} State=UNKNOWN"
        for name, port in node_ports.items()
    )
    return f"""\
ClusterName=torchyard-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmUser={user}
SlurmdUser={user}
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={root}/munge/socket
StateSaveLocation={root}/state
SlurmdSpoolDir={root}/spool/%n
SlurmctldPidFile={root}/slurmctld.pid
SlurmdPidFile={root}/slurmd-%n.pid
SlurmctldLogFile={root}/log/slurmctld.log
SlurmdLogFile={root}/log/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
MpiDefault=none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/filetxt
JobCompLoc={root}/jobcomp.txt
SchedulerParameters=batch_sched_delay=0,sched_min_interval=0
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
ReturnToService=2
MinJobAge=2
KillWait=2
InactiveLimit=0
MailProg=/bin/true
{nodes}
PartitionName={PARTITION} Nodes={",".join(node_ports)} Default=YES MaxTime=INFINITE State=UP
"""


@dataclass
class SlurmCluster:
    root: Path
    conf: Path
    env: dict[str, str]  # SLURM_CONF for the client commands (merge into a process's env)
    pid_files: list[Path] = field(default_factory=list)

    @classmethod
    def start(cls, root: Path) -> "SlurmCluster":
        """Start munged, slurmctld and one slurmd per node; wait until every node is idle.

        Slurm takes its ports from ``slurm.conf``, so they are found free first, and another
        program may bind one before the daemon does: the daemon then exits saying "Address
        already in use", and the cluster is started again on other ports (``PORT_TRIES`` in
        all); any other failure raises at once."""
        root.mkdir(parents=True, exist_ok=True)
        for sub in ("munge", "state", "log", *(f"spool/{n}" for n in NODES)):
            (root / sub).mkdir(parents=True, exist_ok=True)
        (root / "munge").chmod(0o755)  # munged wants its socket's directory searchable
        key = root / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        key.chmod(0o600)
        conf = root / "slurm.conf"
        for attempt in range(1, PORT_TRIES + 1):
            ports = {n: _free_port() for n in NODES}
            conf.write_text(slurm_conf(root, _free_port(), ports, getpass.getuser()))
            cluster = cls(root=root, conf=conf, env={"SLURM_CONF": str(conf)})
            try:
                cluster._start_daemons(key)
                return cluster
            except Exception:
                cluster.stop()
                taken = cluster._port_taken()
                if taken is None or attempt == PORT_TRIES:
                    raise
                for old in [*cluster.pid_files, *(root / "log").iterdir()]:
                    old.unlink(missing_ok=True)  # the next try starts with none of them
            except BaseException:
                cluster.stop()
                raise
        raise AssertionError("unreachable")

    def _start_daemons(self, key: Path) -> None:
        root, env = self.root, {**os.environ, **self.env}
        self._daemon(
            [_program("munged"), "--force", f"--key-file={key}",
             f"--socket={root}/munge/socket", f"--pid-file={root}/munge/munged.pid",
             f"--log-file={root}/log/munged.log", f"--seed-file={root}/munge/seed"],
            root / "munge" / "munged.pid", env,
        )
        self._daemon([_program("slurmctld"), "-i"], root / "slurmctld.pid", env)
        for node in NODES:
            self._daemon([_program("slurmd"), "-N", node], root / f"slurmd-{node}.pid", env)
        self._wait_idle()

    def _port_taken(self) -> str | None:
        """The log line of a daemon that found its port taken, if one did."""
        for log in sorted((self.root / "log").glob("*.log")):
            for line in log.read_text(errors="replace").splitlines():
                if PORT_TAKEN in line:
                    return f"{log.name}: {line}"
        return None

    def _daemon(self, argv: list[str], pid_file: Path, env: dict[str, str]) -> None:
        """Run a daemon that forks into the background and writes ``pid_file``."""
        self.pid_files.append(pid_file)
        subprocess.run(argv, env=env, check=True, timeout=START_TIMEOUT_S, cwd=self.root,
                       stdin=subprocess.DEVNULL, capture_output=True)
        deadline = time.monotonic() + START_TIMEOUT_S
        while not _read_pid(pid_file):
            if (taken := self._port_taken()) is not None:  # it exits without a pid file
                raise RuntimeError(f"{argv[0]}: its port was taken: {taken}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"{argv[0]} wrote no pid file; logs in {self.root / 'log'}")
            time.sleep(0.05)

    def _wait_idle(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if (taken := self._port_taken()) is not None:  # it may retry for a while
                raise RuntimeError(f"a daemon's port was taken: {taken}")
            for pid_file in self.pid_files:  # a daemon that exited fails the start now
                pid = _read_pid(pid_file)
                if pid is None or not _alive(pid):
                    raise RuntimeError(f"{pid_file.name}: the daemon exited; logs in "
                                       f"{self.root / 'log'}")
            out = self.run("sinfo", "-h", "-N", "-o", "%N %T", check=False).stdout
            states = dict(line.split() for line in out.splitlines() if line.strip())
            if all(states.get(n) == "idle" for n in NODES):
                return
            if time.monotonic() > deadline:
                log = (self.root / "log" / "slurmctld.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"nodes not idle ({states}); slurmctld.log:\n{log}")
            time.sleep(0.1)

    def run(self, *argv: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        """A Slurm client command against this cluster."""
        return subprocess.run(list(argv), env={**os.environ, **self.env}, text=True,
                              capture_output=True, check=check, timeout=30)

    def cancel_all(self) -> None:
        """Cancel every job and wait until none is left running."""
        self.run("scancel", f"--user={getpass.getuser()}", check=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            out = self.run("squeue", "-h", "-o", "%i", check=False).stdout
            if not out.strip():
                return
            time.sleep(0.2)

    def stop(self) -> None:
        """Cancel what is queued, then stop each daemon by its pid: SIGTERM → grace → SIGKILL."""
        ctld = self.root / "slurmctld.pid"
        if ctld in self.pid_files and (pid := _read_pid(ctld)) and _alive(pid):
            self.cancel_all()  # (a controller that exited would let scancel wait 30 s)
        for pid_file in reversed(self.pid_files):  # slurmd first, munged last
            pid = _read_pid(pid_file)
            if pid:
                _stop_pid(pid)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _stop_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + STOP_GRACE_S
    while time.monotonic() < deadline:
        if not _alive(pid):
            return
        time.sleep(0.05)
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
            return True
        except ProcessLookupError:
            return False
