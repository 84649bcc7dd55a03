"""A script job for tests: proves a secret reached the rank without printing it.

Prints the SHA-256 of ``$HF_TOKEN`` and reports ``has_secret`` (1 when set) with a loss.
"""

import hashlib
import os

import worker

value = os.environ.get("HF_TOKEN", "")
print("HF_TOKEN sha256", hashlib.sha256(value.encode()).hexdigest(), flush=True)
worker.report(epoch=1, loss=1.0, has_secret=1 if value else 0)
