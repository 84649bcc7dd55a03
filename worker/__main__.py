"""``python -m worker --spec RUN_DIR/spec.json`` (started by torchrun, once per rank)."""

from __future__ import annotations

import logging
import os

from worker.train import main

if __name__ == "__main__":
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s rank{os.environ.get('RANK', '0')} %(levelname)s %(name)s: %(message)s",
    )
    main()
