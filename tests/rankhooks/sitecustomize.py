"""Test-only hooks into the built-in trainer's ranks, injected from outside the product.

The live-server fixture (``tests/conftest.py``) puts this directory on the ``PYTHONPATH`` every
job process inherits, so Python imports this file at start-up in every rank (and in a warm
server, whose forked ranks inherit it). It wraps ``worker.train._train_epoch`` as soon as
``worker.train`` is imported. Two hooks, each set per job or per server:

* epoch sleep — sleep that long before each epoch's training pass (outside its timing, and
  without a heartbeat: a long sleep looks like a hung rank), so a test can watch or cancel a
  running job;
* fail rank — that rank raises at the start of epoch 1.

Per job, from the job's labels (``RUN_DIR/spec.json``; ``tests.conftest.hooks`` builds them):
``test.epoch_sleep_s`` and ``test.fail_rank``; so jobs with different hooks share one server.
Per server, from its environment (the ranks inherit ``TORCHYARD_TEST_*``):
``TORCHYARD_TEST_EPOCH_SLEEP_S`` and ``TORCHYARD_TEST_FAIL_RANK``. A job's label wins.

Both are read when the wrapped function runs, not when ``worker.train`` is imported: a warm
server imports it once and forks it for every rank of every job.
"""

# Every job process imports this (its relays, tees and attempt loops too): only modules Python
# has loaded at start-up already, so it costs them next to nothing (importlib.abc and json were
# 13 ms of CPU each, ~1,000 processes a run). json is imported when a spec is read.
import importlib.machinery
import os
import sys

TARGET = "worker.train"
# label key → the server-wide variable it stands in for
HOOKS = {
    "test.epoch_sleep_s": "TORCHYARD_TEST_EPOCH_SLEEP_S",
    "test.fail_rank": "TORCHYARD_TEST_FAIL_RANK",
}


def _labels() -> dict:
    """The job's labels, from ``RUN_DIR/spec.json`` ({} outside a job, or without a spec)."""
    run_dir = os.environ.get("TORCHYARD_RUN_DIR")
    if not run_dir:
        return {}
    import json

    try:
        with open(os.path.join(run_dir, "spec.json")) as f:
            return json.load(f).get("labels") or {}
    except (OSError, ValueError):
        return {}


def _settings() -> dict[str, str]:
    """Each hook's value for this job: its label, else the server's variable; absent = off."""
    labels = _labels()
    found = {}
    for label, variable in HOOKS.items():
        value = labels.get(label) or os.environ.get(variable)
        if value:
            found[label] = value
    return found


def _patch(module) -> None:  # type: ignore[no-untyped-def]
    train_epoch = module._train_epoch

    def hooked(model, optimizer, loss_fn, sampler, *args, **kwargs):  # type: ignore[no-untyped-def]
        settings = _settings()  # per call: a warm rank imported this module before its job
        rank = int(os.environ.get("RANK", "0"))
        fail_rank = settings.get("test.fail_rank")
        if fail_rank is not None and int(fail_rank) == rank and sampler.epoch == 1:
            raise RuntimeError(f"test hook: rank {rank} failed")
        sleep_s = float(settings.get("test.epoch_sleep_s") or 0)
        if sleep_s:
            import time

            time.sleep(sleep_s)
        return train_epoch(model, optimizer, loss_fn, sampler, *args, **kwargs)

    module._train_epoch = hooked


class _Loader:  # a loader by its two methods (importlib.abc costs an import)
    def __init__(self, inner) -> None:  # type: ignore[no-untyped-def]
        self.inner = inner

    def create_module(self, spec):  # type: ignore[no-untyped-def]
        return self.inner.create_module(spec)

    def exec_module(self, module) -> None:  # type: ignore[no-untyped-def]
        self.inner.exec_module(module)
        _patch(module)


class _Finder:  # a meta path finder by its method
    def find_spec(self, name, path, target=None):  # type: ignore[no-untyped-def]
        if name != TARGET:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is not None and spec.loader is not None:
            spec.loader = _Loader(spec.loader)
        return spec


sys.meta_path.insert(0, _Finder())
