"""The webhook endpoints an operator configured, and which of them a job is subscribed to.

Format of ``TORCHYARD_WEBHOOKS_FILE``: one JSON object, endpoint name → endpoint::

    {"ci":    {"url": "https://ci.example.com/hooks/torchyard", "secret": "whsec_<base64>"},
     "chat":  {"url": "https://hooks.slack.com/services/…", "secret": "whsec_<base64>",
               "events": ["failed"], "all_jobs": true, "format": "slack"}}

``events`` (default: every event) filters what the endpoint hears; ``all_jobs`` subscribes it to
every job, not only those naming it in ``notify``; ``format`` ``"slack"`` sends a one-line chat
message (``{"text": …}``) instead of the Standard Webhooks JSON body. Every delivery is signed with
the endpoint's secret either way.

The file is read at every submit and every delivery round, so an edited file takes effect
without a restart; the server refuses to start with a file it cannot use. A job's subscriptions
(endpoint → events) are fixed when it is submitted (:func:`subscriptions`); URLs and secrets are
looked up by name when each delivery is sent, and never appear in an API answer, a log line or
an exception message.
"""

import base64
import binascii
import json
import logging
import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from torchyard_contract.state import WebhookEvent

logger = logging.getLogger(__name__)

SETTING = "TORCHYARD_WEBHOOKS_FILE"
FIELD = "notify"
EVENTS = tuple(e.value for e in WebhookEvent)
FORMATS = ("standard", "slack")
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
SECRET_PREFIX = "whsec_"
_KEYS = {"url", "secret", "events", "all_jobs", "format"}


class WebhookConfigError(ValueError):
    """The webhooks file cannot be used; the message names the endpoint and key, never a
    secret or a URL."""


class NotifyRefused(ValueError):
    """A ``notify`` this server cannot satisfy; the message names the field and known names."""

    def __init__(self, message: str) -> None:
        super().__init__(f"{FIELD}: {message}")


@dataclass(frozen=True)
class Endpoint:
    name: str
    url: str
    secret: str = ""
    events: tuple[str, ...] = EVENTS
    all_jobs: bool = False
    format: str = "standard"

    def __repr__(self) -> str:  # never the secret nor the URL (it may hold a token)
        return f"Endpoint(name={self.name!r}, events={self.events!r}, format={self.format!r})"


def read_endpoints(path: Path | None) -> dict[str, Endpoint]:
    """Every endpoint of the file (empty when unset); raises :class:`WebhookConfigError`."""
    if path is None:
        return {}
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise WebhookConfigError(f"{SETTING}: cannot read {path} ({exc.strerror})") from None
    except ValueError:
        raise WebhookConfigError(f"{SETTING}: {path} is not valid JSON") from None
    if not isinstance(data, dict):
        raise WebhookConfigError(f"{SETTING}: must be a JSON object of name → endpoint")
    return {name: _endpoint(name, value) for name, value in data.items()}


def _endpoint(name: object, value: object) -> Endpoint:
    if not isinstance(name, str) or not re.fullmatch(NAME_PATTERN, name):
        raise WebhookConfigError(
            f"{SETTING}: endpoint names are letters, digits, '.', '_', '-' (up to 64)"
        )
    where = f"{SETTING}: endpoint {name!r}"
    if not isinstance(value, dict):
        raise WebhookConfigError(f"{where}: must be an object with url and secret")
    unknown = sorted(set(value) - _KEYS)
    if unknown:
        raise WebhookConfigError(f"{where}: unknown key {unknown[0]!r}; known: {sorted(_KEYS)}")
    url = value.get("url")
    parts = urlsplit(url) if isinstance(url, str) else None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise WebhookConfigError(f"{where}: url must be an http:// or https:// URL")
    secret = value.get("secret")
    if not isinstance(secret, str) or not secret.startswith(SECRET_PREFIX):
        raise WebhookConfigError(f"{where}: secret must be '{SECRET_PREFIX}<base64>'")
    try:
        if not base64.b64decode(secret[len(SECRET_PREFIX):], validate=True):
            raise ValueError
    except (binascii.Error, ValueError):
        raise WebhookConfigError(f"{where}: secret must be '{SECRET_PREFIX}' + base64 of "
                                 "at least one byte") from None
    events = value.get("events", list(EVENTS))
    if not isinstance(events, list) or not events or any(e not in EVENTS for e in events):
        raise WebhookConfigError(f"{where}: events must be a non-empty list of {list(EVENTS)}")
    all_jobs = value.get("all_jobs", False)
    if not isinstance(all_jobs, bool):
        raise WebhookConfigError(f"{where}: all_jobs must be true or false")
    fmt = value.get("format", "standard")
    if fmt not in FORMATS:
        raise WebhookConfigError(f"{where}: format must be one of {list(FORMATS)}")
    return Endpoint(name, url, secret, tuple(dict.fromkeys(events)), all_jobs, fmt)


def endpoint_names(path: Path | None) -> tuple[str, ...]:
    """The names a job may put in ``notify`` now, sorted: none when the setting is unset or the
    file cannot be used (:func:`subscriptions` then refuses every name)."""
    try:
        return tuple(sorted(read_endpoints(path)))
    except WebhookConfigError:
        return ()


def subscriptions(notify: list[str], path: Path | None) -> dict[str, list[str]]:
    """Endpoint name → events, for a job naming ``notify``: the endpoints it names plus every
    ``all_jobs`` one. Raises :class:`NotifyRefused` naming unknown endpoints and the known ones."""
    if notify and path is None:
        raise NotifyRefused(f"this server has no webhook endpoints ({SETTING} is not set)")
    try:
        endpoints = read_endpoints(path)
    except WebhookConfigError as exc:
        if not notify:  # a job that names no endpoint is not refused for the file's sake
            logger.error("webhooks: every-job endpoints skipped: %s", exc)
            return {}
        raise NotifyRefused(f"the server's webhooks file cannot be used: {exc}") from None
    unknown = sorted({n for n in notify if n not in endpoints})
    if unknown:
        raise NotifyRefused(
            f"unknown webhook endpoint {', '.join(map(repr, unknown))}; this server defines: "
            f"{', '.join(sorted(endpoints)) or 'none'}"
        )
    chosen = [n for n in endpoints if n in notify or endpoints[n].all_jobs]
    return {n: list(endpoints[n].events) for n in chosen}
