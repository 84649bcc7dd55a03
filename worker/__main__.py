"""``python -m worker --spec RUN_DIR/spec.json`` (started by torchrun, once per rank)."""

import gc
import logging

# No collections while torch is imported (a cold rank: ~15 % of the imports' CPU); the trainer
# runs with the collector on.
gc.disable()
from worker.env import WorkerEnv  # noqa: E402
from worker.train import main  # noqa: E402

gc.enable()

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{WorkerEnv.current().rank} %(levelname)s %(name)s: %(message)s",
    )
    # One INFO line per metrics POST would bury the rank's own messages in its log.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    main()
