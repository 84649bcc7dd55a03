"""TensorBoard event files of a job, written by the server into ``RUN_DIR/tensorboard``.

The events are tensorboardX's protocol buffers (``Event`` with a scalar ``Summary``: what
TensorBoard's own reader, ``EventAccumulator``, reads as scalars), framed as TFRecords with
tensorboardX's masked CRC-32C. tensorboardX is imported on the first write (numpy and protobuf,
~0.15 CPU s), with ``import torch`` refused while it loads: tensorboardX takes torch when it can
(to accept tensors), and the server never imports torch (it writes plain floats).

The run directory is the job's: anything there may have been put there by it. The directory is
opened without following a symlink and every file is created or removed relative to that open
descriptor (``O_NOFOLLOW``, ``O_EXCL``), so a job that swaps ``tensorboard/`` for a symlink
cannot make the server write or delete anywhere else.

An :class:`EventFile` is a cache of the stored records: when a supervisor starts writing a
job's files (a start, a restart, a failover) it removes the event files the server wrote before
and writes the job's records again from the first, so the files hold each record once.
"""

import importlib.abc
import os
import socket
import struct
import sys
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from service.domain.tracking.points import Point
from torchyard_contract.rundir import RunDir

# The server's event files (TensorBoard reads every file with "tfevents" in its name).
SUFFIX = ".torchyard"
PREFIX = "events.out.tfevents."
FILE_VERSION = "brain.Event:2"
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class _NoTorch(importlib.abc.MetaPathFinder):
    def find_spec(self, name: str, path: Any, target: Any = None) -> None:
        if name == "torch" or name.startswith("torch."):
            raise ImportError("the torchyard server does not import torch")
        return None


_TBX: dict[str, ModuleType] = {}


def _tensorboardx() -> tuple[ModuleType, ModuleType, Any]:
    """(event_pb2, summary_pb2, masked_crc32c) from tensorboardX, loaded once, torch refused."""
    if not _TBX:
        guard = _NoTorch()
        sys.meta_path.insert(0, guard)
        try:
            from tensorboardX import record_writer
            from tensorboardX.proto import event_pb2, summary_pb2
        finally:
            sys.meta_path.remove(guard)
        _TBX.update(event=event_pb2, summary=summary_pb2, record=record_writer)
    return _TBX["event"], _TBX["summary"], _TBX["record"].masked_crc32c


class TensorBoardUnwritable(OSError):
    """The run directory, or its ``tensorboard`` entry, is not a directory the server may use."""


def _frame(data: bytes, masked_crc32c: Any) -> bytes:
    header = struct.pack("Q", len(data))
    return (header + struct.pack("I", masked_crc32c(header)) + data
            + struct.pack("I", masked_crc32c(data)))


class EventFile:
    """The event file the server appends a job's points to."""

    def __init__(self, run: RunDir) -> None:
        self._event_pb2, self._summary_pb2, self._crc = _tensorboardx()
        self._dir = _open_dir(run)
        try:
            for name in os.listdir(self._dir):
                if name.startswith(PREFIX) and name.endswith(SUFFIX):
                    os.unlink(name, dir_fd=self._dir)  # an earlier writer's: written again
            name = f"{PREFIX}{int(time.time())}.{socket.gethostname()}{SUFFIX}"
            fd = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644,
                         dir_fd=self._dir)
        except OSError:
            os.close(self._dir)
            raise
        self._file = os.fdopen(fd, "wb")
        first = self._event_pb2.Event(wall_time=time.time(), file_version=FILE_VERSION)
        self._file.write(_frame(first.SerializeToString(), self._crc))

    def write(self, points: Sequence[Point]) -> None:
        """Append one scalar event per point and flush (no fsync: the file is a cache)."""
        if not points:
            return
        event, summary = self._event_pb2.Event, self._summary_pb2.Summary
        frames = []
        for p in points:
            value = summary.Value(tag=p.key, simple_value=p.value)
            e = event(wall_time=p.timestamp_ms / 1000, step=p.step, summary=summary(value=[value]))
            frames.append(_frame(e.SerializeToString(), self._crc))
        self._file.write(b"".join(frames))
        self._file.flush()

    def close(self) -> None:
        try:
            self._file.close()
        finally:
            os.close(self._dir)


def _open_dir(run: RunDir) -> int:
    """A descriptor of ``RUN_DIR/tensorboard``, made if missing; no symlink on the way."""
    try:
        root = os.open(run.root, _DIR_FLAGS)
    except OSError as exc:
        raise TensorBoardUnwritable(f"run directory {run.root}: {exc.strerror}") from None
    try:
        name = run.tensorboard_dir.name
        try:
            os.mkdir(name, 0o755, dir_fd=root)
        except FileExistsError:
            pass
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=root)
        except OSError as exc:
            raise TensorBoardUnwritable(
                f"{run.tensorboard_dir} is not a directory the server may write ({exc.strerror})"
            ) from None
    finally:
        os.close(root)
