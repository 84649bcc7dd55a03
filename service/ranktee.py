"""Forwarding stub, kept for one release: ``python -m service.run.ranktee`` is now
``python -m service.run.ranktee``.

A torchrun started by a shim from before the upgrade still runs ``python -m service.run.ranktee`` for
each rank of its next attempt. Remove in the release after.
"""

from service.run.ranktee import main

if __name__ == "__main__":
    main()
