"""What a submission must satisfy beyond its schema, given this server's settings.

Contract: :func:`admit` returns the spec to store, or raises :class:`AdmissionRefused` (403: the
server is not configured to run this) or :class:`torchyard_contract.confinement.PathRefused` (422: a path
outside the configured roots). It never touches the filesystem beyond resolving paths.

* Script jobs (a spec with an ``entrypoint``) run arbitrary code, so they need API tokens to be
  configured whatever address the server binds.
* ``dataset_root`` must lie inside ``TORCHYARD_DATA_DIRS`` (default ``$TORCHYARD_HOME/data``);
  ``..`` and symlinks leading outside are refused. The stored spec carries the resolved absolute
  path, so a relative path means the same thing to the ranks as it did here.
"""

from pydantic import ValidationError

from service.settings import Settings
from torchyard_contract.confinement import PathRefused, confine
from torchyard_contract.spec import JobSpec


class AdmissionRefused(PermissionError):
    """The server's configuration does not allow this job (answered with 403)."""


def require_tokens_for_scripts(spec: JobSpec, settings: Settings) -> None:
    """Refuse a script job unless API tokens are configured."""
    if spec.is_script and not settings.api_tokens_configured:
        raise AdmissionRefused(
            "entrypoint: script jobs run arbitrary code and need API tokens; start the server "
            "with TORCHYARD_API_TOKENS (or TORCHYARD_API_TOKENS_FILE) set"
        )


def confine_dataset_root(spec: JobSpec, settings: Settings) -> JobSpec:
    if spec.dataset_root is None:
        return spec
    try:
        resolved = confine(spec.dataset_root, settings.data_roots, "dataset_root")
    except (OSError, RuntimeError) as exc:  # e.g. a name too long for the filesystem
        raise PathRefused("dataset_root", f"cannot be resolved ({exc.strerror or exc})") from None
    try:  # validated again: the resolved path must still satisfy the spec (e.g. its length)
        return JobSpec.model_validate({**spec.model_dump(), "dataset_root": str(resolved)})
    except ValidationError as exc:
        raise PathRefused("dataset_root", exc.errors()[0]["msg"]) from None


def admit(spec: JobSpec, settings: Settings) -> JobSpec:
    require_tokens_for_scripts(spec, settings)
    return confine_dataset_root(spec, settings)
