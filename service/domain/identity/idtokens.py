"""JWTs of an identity provider (Keycloak, Dex, …): which torchyard user a token names.

Checked with PyJWT (``cryptography`` for the keys), never by hand: the signature (RS256 or
ES256 only, with a key of the provider's JSON Web Key Set that names the token's ``kid``), the
issuer and audience (``TORCHYARD_JWT_ISSUER``, ``TORCHYARD_JWT_AUDIENCE``), and the times
(``exp`` required, ``nbf`` and ``iat`` when present, ``LEEWAY_S`` of clock skew). ``alg: none``,
HS256 (signed with the public key as a shared secret) and every other algorithm are refused
before any key is looked at.

Keys: read from ``TORCHYARD_JWT_JWKS_URL`` (or ``_FILE``) on first use, kept, read again when
they are ``MAX_AGE_S`` old, and when a token names a key id the set does not hold (a rotation)
— at most once every ``MIN_REFRESH_S``, so tokens with made-up key ids cannot make the server
hammer the provider.

Contract: :meth:`JwtVerifier.user_of` returns the value of the user claim
(``TORCHYARD_JWT_USER_CLAIM``), or raises :class:`JwtRefused` saying why.
"""

import json
import logging
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import jwt

from service.settings import Settings

logger = logging.getLogger(__name__)

ALGORITHMS = ("RS256", "ES256")
LEEWAY_S = 30.0
MAX_AGE_S = 3600.0
MIN_REFRESH_S = 30.0
FETCH_TIMEOUT_S = 5.0
JWKS_MAX_BYTES = 1024 * 1024


class JwtRefused(ValueError):
    """A JWT this server does not accept; the message says why (never the token)."""


def looks_like_jwt(token: str) -> bool:
    """A compact JWS: three base64url parts, the first a JSON header (``eyJ`` = ``{"``)."""
    return token.startswith("eyJ") and token.count(".") == 2


@dataclass
class KeySet:
    """The provider's signing keys by key id, read from a URL or a file."""

    url: str | None
    file: Path | None
    _keys: dict[str | None, jwt.PyJWK] = field(default_factory=dict)
    _read_at: float = -float("inf")
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def key(self, kid: str | None) -> jwt.PyJWK:
        with self._lock:
            now = time.monotonic()
            stale = now - self._read_at >= MAX_AGE_S
            unknown = self._find(kid) is None and now - self._read_at >= MIN_REFRESH_S
            if stale or unknown:
                self._read_at = now  # also on failure: no retry storm against a provider down
                try:
                    self._keys = self._read()
                except (OSError, ValueError, jwt.PyJWKSetError) as exc:
                    logger.warning("jwt: cannot read the key set: %s", exc)
            found = self._find(kid)
        if found is None:
            raise JwtRefused(f"no key {kid!r} in the identity provider's key set")
        return found

    def _find(self, kid: str | None) -> jwt.PyJWK | None:
        if kid is None and len(self._keys) == 1:  # a provider with one key may omit kid
            return next(iter(self._keys.values()))
        return self._keys.get(kid)

    def _read(self) -> dict[str | None, jwt.PyJWK]:
        if self.url is not None:
            request = urllib.request.Request(self.url, headers={"Accept": "application/json"})
            with urllib.request.urlopen(request, timeout=FETCH_TIMEOUT_S) as answer:  # noqa: S310
                body = answer.read(JWKS_MAX_BYTES + 1)
        else:
            assert self.file is not None
            body = self.file.read_bytes()[: JWKS_MAX_BYTES + 1]
        if len(body) > JWKS_MAX_BYTES:
            raise ValueError("the key set is larger than 1 MiB")
        data = json.loads(body)
        keys = {}
        for entry in data.get("keys", []) if isinstance(data, dict) else []:
            if not isinstance(entry, dict) or entry.get("use", "sig") != "sig":
                continue
            try:
                key = jwt.PyJWK(entry)
            except jwt.PyJWKError:
                continue  # a key of a kind not accepted (symmetric, unknown curve…)
            if key.algorithm_name in ALGORITHMS:
                keys[entry.get("kid")] = key
        return keys


@dataclass
class JwtVerifier:
    issuer: str
    audience: str
    user_claim: str
    keys: KeySet

    @classmethod
    def from_settings(cls, settings: Settings) -> "JwtVerifier | None":
        if not settings.jwt_enabled:
            return None
        assert settings.jwt_issuer and settings.jwt_audience  # the settings require them
        return cls(settings.jwt_issuer, settings.jwt_audience, settings.jwt_user_claim,
                   KeySet(settings.jwt_jwks_url, settings.jwt_jwks_file))

    def user_of(self, token: str) -> str:
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise JwtRefused("not a well-formed JWT") from None
        alg = header.get("alg")
        if alg not in ALGORITHMS:
            raise JwtRefused(f"algorithm {str(alg)[:20]!r} is not accepted (only "
                             f"{', '.join(ALGORITHMS)})")
        kid = header.get("kid")
        key = self.keys.key(kid if isinstance(kid, str) else None)
        if key.algorithm_name != alg:
            raise JwtRefused(f"key {kid!r} is for {key.algorithm_name}, the token says {alg}")
        try:
            claims = jwt.decode(
                token, key.key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
                leeway=LEEWAY_S, options={"require": ["exp", "iss", "aud"]},
            )
        except jwt.ExpiredSignatureError:
            raise JwtRefused("the token has expired") from None
        except jwt.ImmatureSignatureError:
            raise JwtRefused("the token is not valid yet (nbf or iat in the future)") from None
        except jwt.InvalidAudienceError:
            raise JwtRefused("the token is not for this audience") from None
        except jwt.InvalidIssuerError:
            raise JwtRefused("the token is from another issuer") from None
        except jwt.InvalidSignatureError:
            raise JwtRefused("bad signature") from None
        except jwt.PyJWTError as exc:
            raise JwtRefused(f"invalid token ({type(exc).__name__})") from None
        user = claims.get(self.user_claim)
        if not isinstance(user, str) or not user:
            raise JwtRefused(f"the token has no {self.user_claim!r} claim naming a user")
        return user
