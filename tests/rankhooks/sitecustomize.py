"""Test-only hooks into the built-in trainer's ranks, injected from outside the product.

The live-server fixture (``tests/conftest.py``) puts this directory on the ``PYTHONPATH`` every
job process inherits, so Python imports this file at start-up in every rank. When the server was
started with one of these variables, it wraps ``worker.train._train_epoch`` as soon as
``worker.train`` is imported:

* ``TORCHYARD_TEST_EPOCH_SLEEP_S`` — sleep that long before each epoch's training pass (outside
  its timing, and without a heartbeat: a long sleep looks like a hung rank), so a test can watch
  or cancel a running job;
* ``TORCHYARD_TEST_FAIL_RANK`` — that rank raises at the start of epoch 1.

Without either variable nothing is touched.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import time

SLEEP_S = float(os.environ.get("TORCHYARD_TEST_EPOCH_SLEEP_S") or 0)
FAIL_RANK = os.environ.get("TORCHYARD_TEST_FAIL_RANK")
TARGET = "worker.train"


def _patch(module) -> None:  # type: ignore[no-untyped-def]
    train_epoch = module._train_epoch

    def hooked(model, optimizer, loss_fn, sampler, *args, **kwargs):  # type: ignore[no-untyped-def]
        # Read now, not when worker.train is imported: a warm server imports it for every rank.
        rank = int(os.environ.get("RANK", "0"))
        if FAIL_RANK is not None and int(FAIL_RANK) == rank and sampler.epoch == 1:
            raise RuntimeError(f"test hook: rank {rank} failed")
        if SLEEP_S:
            time.sleep(SLEEP_S)
        return train_epoch(model, optimizer, loss_fn, sampler, *args, **kwargs)

    module._train_epoch = hooked


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: importlib.abc.Loader) -> None:
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        _patch(module)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


if SLEEP_S or FAIL_RANK is not None:
    sys.meta_path.insert(0, _Finder())
