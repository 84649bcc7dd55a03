"""The server's writes into a job's run directory: confined, and owned as the directory is.

A run directory may belong to the job's own Unix user (docs/security.md, "Run as the team's Unix
user"), whose processes can put anything there — a symlink named ``pause.json`` pointing at
``/etc/shadow``, a directory swapped for a link while the server copies into it. A server running
as root must never write through such a thing. So every write here:

* reaches its directory as ``torchyard_contract.safefile.open_parent`` does (no symlink followed
  outside trusted directories) and acts relative to that open directory (``openat``);
* creates files with ``O_CREAT | O_EXCL | O_NOFOLLOW`` under a random name and renames them into
  place (a rename replaces a link; it never writes through one), and directories with ``mkdirat``;
* gives what it creates its directory's owner and group when the server runs as root and the
  directory is another user's (a run directory handed to the job's user stays wholly theirs), so
  the job's processes can replace or remove what the server wrote there, and the server's confined
  reads (``safefile.foreign``) accept it.

A server running as its own user, in its own run directories, gets plain atomic writes.
"""

import os
import shutil
import stat
from pathlib import Path

from torchyard_contract.safefile import open_dir, open_parent

RUN_DIR_MODE = 0o700  # a run directory handed to a job's user: no one else's to read


def _parent(path: Path) -> tuple[int, str]:
    found = open_parent(path)
    if found is None:
        raise FileNotFoundError(f"{path}: its directory cannot be reached (missing, or a link)")
    return found


def _owner(dir_fd: int) -> tuple[int, int] | None:
    """Who a new entry of this directory should belong to: its owner and group when the server,
    as root, writes into another user's directory; None = the creator (as ever)."""
    st = os.fstat(dir_fd)
    if os.geteuid() != 0 or st.st_uid == 0:
        return None
    return st.st_uid, st.st_gid


def make_dir(path: Path, mode: int = 0o755) -> None:
    """``mkdir -p``, confined; each directory created gets its parent's owner (and, made for
    another user, mode ``RUN_DIR_MODE``). One that exists (whatever it is: a job's link
    included) is left as it is; writes below it are confined."""
    fd = open_dir(path)
    if fd is not None:
        os.close(fd)
        return
    if path.parent != path:
        make_dir(path.parent, mode)
    dir_fd, leaf = _parent(path)
    try:
        owner = _owner(dir_fd)
        try:
            os.mkdir(leaf, mode if owner is None else RUN_DIR_MODE, dir_fd=dir_fd)
        except FileExistsError:
            return
        if owner is not None:
            os.chown(leaf, *owner, dir_fd=dir_fd, follow_symlinks=False)
    finally:
        os.close(dir_fd)


def _create(dir_fd: int, name: str, mode: int, owner: tuple[int, int] | None) -> int:
    fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, mode,
                 dir_fd=dir_fd)
    if owner is not None:
        os.fchown(fd, *owner)
    return fd


def write_file(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Replace ``path`` with ``data`` atomically: a new file under a random hidden name in the
    same directory, renamed over ``path`` (a reader never sees half of it)."""
    dir_fd, leaf = _parent(path)
    tmp = f".{leaf}.{os.urandom(8).hex()}.tmp"
    try:
        fd = _create(dir_fd, tmp, mode, _owner(dir_fd))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
        finally:
            os.close(fd)
        try:
            os.replace(tmp, leaf, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            os.unlink(tmp, dir_fd=dir_fd)
            raise
    finally:
        os.close(dir_fd)


def remove(path: Path) -> None:
    """Unlink ``path`` (never what a link of that name points at); missing is no error."""
    found = open_parent(path)
    if found is None:
        return
    dir_fd, leaf = found
    try:
        os.unlink(leaf, dir_fd=dir_fd)
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        pass
    finally:
        os.close(dir_fd)


def open_append(path: Path) -> int:
    """A descriptor to append to the log ``path``: created (owned as its directory is) or, when
    it exists, only if it is a regular file its directory's owner owns (never a FIFO, a link, or
    a hard link to someone else's file). Raises ``OSError``."""
    dir_fd, leaf = _parent(path)
    try:
        try:
            return _create(dir_fd, leaf, 0o644, _owner(dir_fd))
        except FileExistsError:
            pass
        fd = os.open(leaf, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK
                     | os.O_CLOEXEC, dir_fd=dir_fd)
        st, dir_st = os.fstat(fd), os.fstat(dir_fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid not in (dir_st.st_uid, os.geteuid()) \
                or (st.st_uid != dir_st.st_uid and st.st_nlink != 1):
            os.close(fd)
            raise PermissionError(f"{path} is not a log file of its directory's owner")
        os.set_blocking(fd, True)
        return fd
    finally:
        os.close(dir_fd)


def replace_tree(src: Path, dest: Path) -> None:
    """``dest`` becomes a copy of the tree ``src`` (a trusted directory of the server's: a
    package's files), symlinks copied as symlinks, modes and times kept; whatever ``dest`` was is
    removed first. Every entry is made relative to a descriptor of the directory created for it
    (``dest`` may sit in a directory a job's user can rename things in), owned as ``dest``'s
    parent is (and then, at its top, mode ``RUN_DIR_MODE``)."""
    dir_fd, leaf = _parent(dest)
    try:
        try:
            st = os.stat(leaf, dir_fd=dir_fd, follow_symlinks=False)
        except FileNotFoundError:
            st = None
        if st is not None and stat.S_ISDIR(st.st_mode):
            shutil.rmtree(leaf, dir_fd=dir_fd)
        elif st is not None:
            os.unlink(leaf, dir_fd=dir_fd)
        owner = _owner(dir_fd)
        _copy_dir(src, dir_fd, leaf, owner, RUN_DIR_MODE if owner is not None else None)
    finally:
        os.close(dir_fd)


def _copy_dir(
    src: Path, parent_fd: int, name: str, owner: tuple[int, int] | None, mode: int | None = None,
) -> None:
    src_st = os.stat(src, follow_symlinks=False)
    os.mkdir(name, 0o700, dir_fd=parent_fd)
    fd = os.open(name, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC,
                 dir_fd=parent_fd)
    try:
        for entry in os.scandir(src):
            st = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                _copy_dir(Path(entry.path), fd, entry.name, owner)
            elif stat.S_ISLNK(st.st_mode):
                os.symlink(os.readlink(entry.path), entry.name, dir_fd=fd)
                if owner is not None:
                    os.chown(entry.name, *owner, dir_fd=fd, follow_symlinks=False)
            elif stat.S_ISREG(st.st_mode):
                out = _create(fd, entry.name, 0o600, owner)
                try:
                    with open(entry.path, "rb") as f, os.fdopen(out, "wb", closefd=False) as w:
                        shutil.copyfileobj(f, w)
                    os.fchmod(out, stat.S_IMODE(st.st_mode) & 0o777)  # never a set-id bit
                    os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns))
                finally:
                    os.close(out)
        if owner is not None:
            os.fchown(fd, *owner)
        os.fchmod(fd, mode if mode is not None else stat.S_IMODE(src_st.st_mode) & 0o777)
        os.utime(fd, ns=(src_st.st_atime_ns, src_st.st_mtime_ns))
    finally:
        os.close(fd)


def hand_over(root: Path, uid: int, gid: int) -> None:
    """Give the run directory ``root`` (in the server's own runs directory) to the job's user:
    owner ``uid:gid``, mode ``RUN_DIR_MODE``. Only the directory itself changes hands: what the
    server writes below it afterwards gets that owner as it is made; what is already there is
    the user's own (a resumed job's)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        os.fchown(fd, uid, gid)
        os.fchmod(fd, RUN_DIR_MODE)
    finally:
        os.close(fd)
