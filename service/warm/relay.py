"""Forwarding stub, kept for one release: the relay is now ``service/run/warm/relay.py``.

Run as a script (``python service/run/warm/relay.py SOCKET ...``) by a shim started before the
upgrade; it runs the new relay as ``__main__`` with the same arguments.
"""

import runpy
from pathlib import Path

if __name__ == "__main__":
    relay = Path(__file__).resolve().parents[1] / "run" / "warm" / "relay.py"
    runpy.run_path(str(relay), run_name="__main__")
