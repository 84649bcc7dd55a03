"""What a job's processes inherit from the server's environment: everything but its secrets.

Kept apart from ``service.settings`` (pydantic) so the per-job shim can use it without paying
that import on every job's start path.
"""

from collections.abc import Mapping

# Never passed on to a job's shim or ranks (jobs run user code; see docs/security.md).
# TORCHYARD_TOKEN is the CLI's (a server started from an operator's shell may have it); a
# database URL may carry a password.
SECRET_ENV_VARS = frozenset(
    {"TORCHYARD_API_TOKENS", "TORCHYARD_API_TOKENS_FILE", "TORCHYARD_TOKEN",
     "TORCHYARD_SECRETS_FILE", "TORCHYARD_DATABASE_URL"}
)


def environ_for_children(environ: Mapping[str, str]) -> dict[str, str]:
    """``environ`` without the server's secrets: what a job's processes may inherit."""
    return {k: v for k, v in environ.items() if k not in SECRET_ENV_VARS}
