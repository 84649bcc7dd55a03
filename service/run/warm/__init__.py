"""Warm ranks: a per-host fork server holding torch, whose children become a job's processes.

``relay`` (the rank program torchrun starts, and the wire format), ``server`` (the fork server),
``child`` (what a child does to become a rank), ``pool`` (the torchyard server's side: starts,
watches, refills and reports the fork server). Used by the local executor only; see
docs/warm-ranks.md. Importing this package imports nothing else but the contract's
``childenv`` (stdlib only).
"""

from pathlib import Path

from torchyard_contract.childenv import WARM_COLD_ENV, WARM_SOCKET_ENV

# The local executor gives a job's attempt loop the warm server's socket in SOCKET_ENV, or, when warm
# ranks are on but the pool cannot serve, why not in COLD_ENV (the attempt loop logs it, starts cold);
# the attempt loop takes both out of the environment its torchrun and ranks inherit.
SOCKET_ENV = WARM_SOCKET_ENV
COLD_ENV = WARM_COLD_ENV
RELAY_PATH = Path(__file__).resolve().parent / "relay.py"
# Next to the socket: the file a serving warm server holds an exclusive flock on (its pid inside).
LOCK_NAME = "server.lock"
# A warm server's exit status when another one already serves its socket (EX_TEMPFAIL).
BUSY_EXIT = 75
