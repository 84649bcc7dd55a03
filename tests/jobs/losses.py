"""A script job for tests: each rank reports the losses it is given, one epoch at a time.

``python losses.py 'R0;R1' [SLEEP_S]``: ``R<n>`` is rank n's comma list of per-epoch losses
(``nan``, ``inf`` allowed; the last list serves the ranks beyond it). Each epoch the rank prints
``Rank r, Epoch e, Loss: v`` to stdout, logs a line to stderr, reports ``loss`` (and
``samples``, 100 on every rank) and sleeps.
No torch, no process group: quick to start, and each rank runs on its own.
"""

import logging
import os
import sys
import time

import worker


def main() -> None:
    rank = int(os.environ.get("RANK", "0"))
    handler = logging.StreamHandler()  # stderr
    handler.setFormatter(logging.Formatter(f"rank{rank} %(levelname)s %(message)s"))
    log = logging.getLogger("losses")
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    lists = sys.argv[1].split(";")
    losses = [float(v) for v in lists[min(rank, len(lists) - 1)].split(",")]
    sleep_s = float(sys.argv[2]) if len(sys.argv) > 2 else 0.3
    for epoch, loss in enumerate(losses, start=1):
        print(f"Rank {rank}, Epoch {epoch}, Loss: {loss}", flush=True)
        log.info("epoch %d reported", epoch)
        worker.report(epoch=epoch, loss=loss, samples=100)
        time.sleep(sleep_s)


main()
