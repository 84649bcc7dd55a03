"""Secrets a script job names in its spec (``secret_env``), resolved on the server, granted to
teams.

Format of ``TORCHYARD_SECRETS_FILE``: one JSON object, secret name → a value (every team may
use it) or ``{"value": ..., "teams": [...]}`` (only those teams' jobs may)::

    {"hf": "hf_...", "wandb": {"value": "...", "teams": ["vision", "nlp"]}}

Names follow ``torchyard_contract.spec.SecretName``. The file is read on every call, so an edited
file takes effect at the next submit or launch without a restart. A job's team is the one it was
submitted as; a job of no team (an admin without one, or a job older than teams) may use every
secret.

Contract: :func:`check_names` (at submit) raises :class:`SecretRefused` naming the secrets the
team may not use and listing only those it may; :func:`resolve` (at launch, with the job's team)
returns variable → value for the ranks' environment, or raises :class:`SecretRefused`. A value
appears in no exception message and no log line; the caller passes it only through a process
environment (``Submission.env``), never an argv, a file of the run directory or an API answer.
"""

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

FIELD = "secret_env"
SETTING = "TORCHYARD_SECRETS_FILE"


class SecretRefused(ValueError):
    """A ``secret_env`` this server cannot satisfy; the message names the field, never a value."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{FIELD}: {message}")


@dataclass(frozen=True)
class Secret:
    value: str
    teams: frozenset[str] | None  # None: every team

    def granted_to(self, team: str | None) -> bool:
        return self.teams is None or team is None or team in self.teams


def _entry(value: object) -> Secret | None:
    if isinstance(value, str):
        return Secret(value, None)
    if not isinstance(value, dict) or set(value) - {"value", "teams"}:
        return None
    secret, teams = value.get("value"), value.get("teams")
    if not isinstance(secret, str) or not isinstance(teams, list):
        return None
    if not all(isinstance(t, str) for t in teams):
        return None
    return Secret(secret, frozenset(teams))


def read_secrets(path: Path | None) -> dict[str, Secret]:
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
    secrets = {k: _entry(v) for k, v in data.items()} if isinstance(data, dict) else None
    if secrets is None or not all(isinstance(k, str) and v for k, v in secrets.items()):
        raise SecretRefused(f"the server's {SETTING} must be a JSON object of name → string "
                            'or {"value": string, "teams": [team, ...]}')
    return secrets  # type: ignore[return-value]


def check_names(secret_env: Mapping[str, str], path: Path | None, team: str | None = None) -> None:
    """Refuse a spec naming a secret the file does not define or ``team`` may not use (names
    only are compared; the message lists only the names ``team`` may use)."""
    if not secret_env:
        return
    usable = sorted(name for name, s in read_secrets(path).items() if s.granted_to(team))
    refused = sorted({name for name in secret_env.values() if name not in usable})
    if refused:
        listed = f"team {team} may use" if team is not None else "this server defines"
        raise SecretRefused(
            f"unknown secret {', '.join(map(repr, refused))}; {listed}: "
            f"{', '.join(usable) or 'none'}"
        )


def resolve(
    secret_env: Mapping[str, str], path: Path | None, team: str | None = None
) -> dict[str, str]:
    """Variable → secret value for the ranks' environment (empty when nothing is asked)."""
    if not secret_env:
        return {}
    check_names(secret_env, path, team)  # the file (or its grants) may have changed since submit
    secrets = read_secrets(path)
    return {variable: secrets[name].value for variable, name in secret_env.items()}
