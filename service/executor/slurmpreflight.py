"""Checks a Slurm executor must pass before the server starts, each refusing with a message that
says what to change:

* the ranks post their records to the API's public URL, so it must be an address the nodes can
  reach — not loopback or a wildcard, unless every node of the cluster is this very host;
* the attempt loop and the ranks read and write the job's run directory on the nodes, so
  ``HOME/runs`` must be on a filesystem every node sees at the same path: a network or parallel
  filesystem type, every node being this host, or the operator's word for it
  (``TORCHYARD_SLURM_SHARED_RUNS``).

The decisions are pure functions of what was read (mount table, node host names).
"""

import ipaddress
import os
import socket
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

# Filesystem types (as /proc/mounts spells them) that every node can mount at the same path.
SHARED_FS_TYPES = frozenset({
    "nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "glusterfs", "fuse.glusterfs",
    "fuse.ceph", "fuse.juicefs", "fuse.weka", "wekafs", "panfs", "orangefs", "pvfs2", "cifs",
    "smb3", "afs", "fuse.sshfs", "9p", "virtiofs", "fuse.s3fs", "fuse.gcsfuse",
})


class PreflightError(ValueError):
    """The Slurm executor cannot work with this configuration (the server refuses to start)."""


def this_host_names() -> set[str]:
    names = {socket.gethostname(), socket.getfqdn(), "localhost"}
    return {n for n in names if n}


def all_nodes_here(node_hostnames: Iterable[str], here: set[str]) -> bool:
    """True when the cluster has nodes and every one of them is this host."""
    hosts = set(node_hostnames)
    return bool(hosts) and hosts <= here


def _is_local_address(host: str) -> bool:
    if host in ("localhost", ""):
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.endswith(".localhost")
    return addr.is_loopback or addr.is_unspecified


def check_public_url(url: str, nodes_here: bool) -> None:
    """Refuse an API URL the nodes cannot use."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise PreflightError(
            f"TORCHYARD_PUBLIC_URL: {url!r} is not an http(s) URL; the Slurm nodes post "
            "their records there"
        )
    if _is_local_address(parts.hostname) and not nodes_here:
        raise PreflightError(
            f"the ranks would post their records to {url}, which on a Slurm node is that node "
            "itself, not this server: set TORCHYARD_PUBLIC_URL to an address of this server "
            "the nodes can reach (e.g. http://<this host's name>:<port>)"
        )


def mount_type(path: Path, mounts_text: str) -> str | None:
    """The filesystem type of the mount holding ``path``, from ``/proc/mounts`` text."""
    best: tuple[int, str] | None = None
    target = str(path)
    for line in mounts_text.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and (best is None or len(point) > best[0]):
            best = (len(point), fields[2])
    return best[1] if best else None


def check_shared_runs(
    runs_dir: Path, fs_type: str | None, nodes_here: bool, operator_says_shared: bool
) -> None:
    """Refuse run directories the nodes may not see."""
    if nodes_here or operator_says_shared or (fs_type or "") in SHARED_FS_TYPES:
        return
    raise PreflightError(
        f"the Slurm executor needs the run directories on a filesystem every node mounts at "
        f"the same path; {runs_dir} is on {fs_type or 'an unknown filesystem'}, which is local "
        "to this host. Put TORCHYARD_HOME on a shared filesystem (NFS, Lustre, GPFS, BeeGFS, "
        "CephFS, …), or set TORCHYARD_SLURM_SHARED_RUNS=true if this one is shared"
    )


def read_mounts() -> str:
    try:
        return Path("/proc/mounts").read_text()
    except OSError:
        return ""


def resolve_runs_dir(runs_dir: Path) -> Path:
    runs_dir.mkdir(parents=True, exist_ok=True)
    return Path(os.path.realpath(runs_dir))
