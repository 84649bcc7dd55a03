"""``python -m worker --spec RUN_DIR/spec.json`` (started by torchrun, once per rank)."""

import logging

from worker.env import WorkerEnv
from worker.train import main

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{WorkerEnv.current().rank} %(levelname)s %(name)s: %(message)s",
    )
    # One INFO line per metrics POST would bury the rank's own messages in its log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    main()
