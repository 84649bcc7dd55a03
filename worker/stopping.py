"""Whether a rank should stop at a safe point now: the job is being paused (docs/lifecycle.md).

A pause (or a preemption) reaches a rank two ways: SIGTERM from the job's attempt loop (ranks on
its host), and the run directory's pause request (``RunDir.pause_request``; on Slurm, ranks on
other hosts see it on the shared directory). :func:`should_stop` looks at both, so a script that
calls it at each epoch's end checkpoints and exits 0 there instead of being killed when the
spec's ``pause_grace_s`` runs out. The resumed job's next attempt finds the checkpoint
(``worker.checkpoint.load_latest``) and goes on from it.

Contract:

* :func:`catch_sigterm` makes a pause's SIGTERM set the flag instead of ending the process; a
  SIGTERM while no pause is requested (a cancel, a deadline, a guard's stop) still ends it at
  once, as Python's default action does. It takes effect only in the main thread and only
  where SIGTERM still has Python's default action (a script's own handler is left alone).
  :func:`should_stop` calls it, so the first call arms it; the built-in trainer arms it before
  training.
* :func:`should_stop` is a collective when ``torch.distributed`` is initialized: every rank must
  call it at the same point (a MAX all-reduce of one flag), so all ranks stop after the same
  epoch and none waits in a collective for a peer that left. Without a process group it only
  looks at this rank. Outside torchyard it is False unless the process got SIGTERM.
"""

import os
import signal
import sys
import threading

from torchyard_contract.rundir import RunDir
from worker.env import WorkerEnv

_asked = threading.Event()


def _on_sigterm(signum: int, _frame: object) -> None:
    if _pause_requested():
        _asked.set()
        return
    # Not a pause (a cancel, a deadline, a stop): end now, as Python's default action would.
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)


def _pause_requested() -> bool:
    run_dir = WorkerEnv.current().run_dir
    return run_dir is not None and RunDir(run_dir).pause_request.exists()


def catch_sigterm() -> bool:
    """SIGTERM now asks this rank to stop (see the module contract); True if it does."""
    if threading.current_thread() is not threading.main_thread():
        return signal.getsignal(signal.SIGTERM) is _on_sigterm
    current = signal.getsignal(signal.SIGTERM)
    if current is _on_sigterm:
        return True
    if current is not signal.SIG_DFL:
        return False
    signal.signal(signal.SIGTERM, _on_sigterm)
    return True


def asked_here() -> bool:
    """This rank got a pause's SIGTERM, or its job's run directory holds a pause request."""
    return _asked.is_set() or _pause_requested()


def should_stop() -> bool:
    """True when the ranks should checkpoint and exit now (agreed by every rank; see above)."""
    catch_sigterm()
    local = asked_here()
    dist = sys.modules.get("torch.distributed")
    if dist is None or not dist.is_available() or not dist.is_initialized():
        return local
    import torch

    device = "cpu"
    if dist.get_backend() == "nccl":
        device = f"cuda:{torch.cuda.current_device()}"
    flag = torch.tensor([1 if local else 0], dtype=torch.int32, device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())
