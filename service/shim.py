"""Forwarding stub, kept for one release: ``python -m service.run.attemptloop`` is now
``python -m service.run.attemptloop``.

A shim that was running when torchyard was upgraded, or a Slurm batch script queued before it,
still starts ``python -m service.run.attemptloop``; this keeps that working. Remove in the release after.
"""

from service.run.attemptloop import main

if __name__ == "__main__":
    main()
