"""Warm ranks: a per-host fork server holding torch, whose children become a job's processes.

``relay`` (the rank program torchrun starts, and the wire format), ``server`` (the fork server),
``child`` (what a child does to become a rank), ``pool`` (the torchyard server's side: starts,
watches, refills and reports the fork server). Used by the local executor only; see
docs/warm-ranks.md. Importing this package imports nothing else.
"""

from pathlib import Path

# The local executor gives a job's shim the warm server's socket in this variable; the shim
# takes it out of the environment its torchrun and ranks inherit. Both names are listed in
# torchyard_contract.childenv.WARM_HANDOFF_ENV_VARS (what passes from the server to a shim).
SOCKET_ENV = "TORCHYARD_WARM_SOCKET"
# ... or, when warm ranks are on but the pool cannot serve, why (the shim logs it, starts cold).
COLD_ENV = "TORCHYARD_WARM_COLD_REASON"
RELAY_PATH = Path(__file__).resolve().parent / "relay.py"
# Next to the socket: the file a serving warm server holds an exclusive flock on (its pid inside).
LOCK_NAME = "server.lock"
# A warm server's exit status when another one already serves its socket (EX_TEMPFAIL).
BUSY_EXIT = 75
