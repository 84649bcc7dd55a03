"""Secrets a script job names in its spec (``secret_env``), resolved on the server.

Format of ``TORCHYARD_SECRETS_FILE``: one JSON object, secret name → value, both strings::

    {"hf": "hf_...", "wandb": "..."}

Names follow ``torchyard_contract.spec.SecretName``. The file is read on every call, so an edited
file takes effect at the next submit or launch without a restart.

Contract: :func:`check_names` (at submit) raises :class:`SecretRefused` naming the unknown
secrets; :func:`resolve` (at launch) returns variable → value for the ranks' environment, or
raises :class:`SecretRefused`. A value appears in no exception message and no log line; the
caller passes it only through a process environment (``Submission.env``), never an argv, a file
of the run directory or an API answer.
"""

import json
from collections.abc import Mapping
from pathlib import Path

FIELD = "secret_env"
SETTING = "TORCHYARD_SECRETS_FILE"


class SecretRefused(ValueError):
    """A ``secret_env`` this server cannot satisfy; the message names the field, never a value."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{FIELD}: {message}")


def read_secrets(path: Path | None) -> dict[str, str]:
    """Every secret of the file; raises :class:`SecretRefused` when there is no usable file."""
    if path is None:
        raise SecretRefused(f"this server has no secrets ({SETTING} is not set)")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise SecretRefused(f"the server cannot read {SETTING} ({exc.strerror})") from None
    except ValueError:
        # Never the decoder's message: it may quote the file.
        raise SecretRefused(f"the server's {SETTING} is not valid JSON") from None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in data.items()
    ):
        raise SecretRefused(f"the server's {SETTING} must be a JSON object of name → string")
    return data


def check_names(secret_env: Mapping[str, str], path: Path | None) -> None:
    """Refuse a spec naming a secret the file does not define (names only are compared)."""
    if not secret_env:
        return
    known = read_secrets(path).keys()
    unknown = sorted({name for name in secret_env.values() if name not in known})
    if unknown:
        raise SecretRefused(
            f"unknown secret {', '.join(map(repr, unknown))}; this server defines: "
            f"{', '.join(sorted(known)) or 'none'}"
        )


def resolve(secret_env: Mapping[str, str], path: Path | None) -> dict[str, str]:
    """Variable → secret value for the ranks' environment (empty when nothing is asked)."""
    if not secret_env:
        return {}
    check_names(secret_env, path)  # the file may have changed since submit
    secrets = read_secrets(path)
    return {variable: secrets[name] for variable, name in secret_env.items()}
