"""What a job's processes inherit from the server's environment: everything but what is the
server's own — its secrets, its configuration and the state of its processes.

Kept apart from ``service.settings`` (pydantic) so the per-job attempt loop can use it without paying
that import on every job's start path.
"""

from collections.abc import Mapping

from torchyard_contract import envnames

# Never passed on to a job's attempt loop or ranks (jobs run user code; see docs/security.md).
# TORCHYARD_TOKEN is the CLI's (a server started from an operator's shell may have it); a
# database URL may carry a password, and so may the MLflow server's URL beside its token.
SECRET_ENV_VARS = frozenset(
    {"TORCHYARD_API_TOKENS", "TORCHYARD_API_TOKENS_FILE", "TORCHYARD_TOKEN",
     "TORCHYARD_SECRETS_FILE", "TORCHYARD_DATABASE_URL", "TORCHYARD_MLFLOW_TOKEN",
     "TORCHYARD_MLFLOW_TRACKING_URI"}
)
# The server's processes' own state: prometheus-client's multiprocess directory
# (``serve --workers``; upper case, and the lower-case name older releases read). A job that
# inherited it would write into the server's own counters.
SERVER_ONLY_ENV_VARS = frozenset({"PROMETHEUS_MULTIPROC_DIR", "prometheus_multiproc_dir"})
# TORCHYARD_* variables are the server's settings (TORCHYARD_HOME, TORCHYARD_EXECUTOR, …) except
# those torchyard sets for a job (torchyard_contract.envnames; the warm-rank hand-off's below,
# not TORCHYARD_WARM_RANKS and the pool's other settings) and the test
# suite's rank hooks (tests/rankhooks) and the benchmarks' probe (bench/probe): only those pass
# from a process to its children.
# The warm-rank hand-off (service.run.warm): the executor gives a job's attempt loop the warm server's
# socket, or why the job starts cold; the attempt loop takes both out of what its ranks inherit.
WARM_SOCKET_ENV = "TORCHYARD_WARM_SOCKET"
WARM_COLD_ENV = "TORCHYARD_WARM_COLD_REASON"
WARM_HANDOFF_ENV_VARS = frozenset({WARM_SOCKET_ENV, WARM_COLD_ENV})
JOB_ENV_VARS = WARM_HANDOFF_ENV_VARS | frozenset(
    value for name, value in vars(envnames).items()
    if name.isupper() and isinstance(value, str) and value.startswith("TORCHYARD_")
)
JOB_ENV_PREFIXES = ("TORCHYARD_TEST_", "TORCHYARD_BENCH_")
SETTINGS_PREFIX = "TORCHYARD_"


def server_only(name: str) -> bool:
    """True for a variable of the server that no job may inherit."""
    if name in SECRET_ENV_VARS or name in SERVER_ONLY_ENV_VARS:
        return True
    return (
        name.startswith(SETTINGS_PREFIX)
        and name not in JOB_ENV_VARS
        and not name.startswith(JOB_ENV_PREFIXES)
    )


def environ_for_children(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without what is the server's own: what a job's processes may inherit."""
    return {k: v for k, v in environ.items() if not server_only(k)}
