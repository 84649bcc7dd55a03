"""Settings of sign-in by an identity provider (JWTs) and of the audit log
(docs/security.md, "Users, teams and roles"); combined into :class:`service.settings.Settings`."""

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

from pydantic import BaseModel, Field, field_validator, model_validator


class IdentitySettings(BaseModel):
    jwt_jwks_url: str | None = Field(
        default=None, max_length=2048,
        description="URL of the identity provider's JSON Web Key Set (https, or http on a "
        "loopback address); set it (or JWKS_FILE) to accept the provider's JWTs (RS256, "
        "ES256) as bearer tokens; then ISSUER and AUDIENCE are required",
    )
    jwt_jwks_file: Path | None = Field(
        default=None,
        description="file holding the JSON Web Key Set instead of a URL (read at start and "
        "again when a token names a key it does not hold)",
    )
    jwt_issuer: str | None = Field(
        default=None, max_length=2048,
        description="the `iss` every accepted JWT carries (the provider's issuer URL)",
    )
    jwt_audience: str | None = Field(
        default=None, max_length=2048,
        description="the `aud` every accepted JWT carries (the client id the provider issues "
        "torchyard's tokens for)",
    )
    jwt_user_claim: str = Field(
        default="preferred_username", min_length=1, max_length=100,
        description="the JWT claim naming the torchyard user (who must exist and not be "
        "disabled)",
    )
    audit_retention_days: float = Field(
        default=365.0, gt=0, le=36500,
        description="audit log entries older than this are deleted by the clean-up pass",
    )

    @field_validator("jwt_jwks_url")
    @classmethod
    def _https_or_loopback(cls, value: str | None) -> str | None:
        if value is None:
            return value
        parts = urlsplit(value)
        if parts.scheme == "https" and parts.hostname:
            return value
        if parts.scheme == "http" and parts.hostname and _loopback(parts.hostname):
            return value
        raise ValueError("TORCHYARD_JWT_JWKS_URL: must be https (or http on a loopback address)")

    @model_validator(mode="after")
    def _issuer_and_audience_with_keys(self) -> "IdentitySettings":
        if self.jwt_jwks_url is None and self.jwt_jwks_file is None:
            return self
        if self.jwt_jwks_url is not None and self.jwt_jwks_file is not None:
            raise ValueError("TORCHYARD_JWT_JWKS_URL and TORCHYARD_JWT_JWKS_FILE: set one")
        missing = [name for name, value in (("TORCHYARD_JWT_ISSUER", self.jwt_issuer),
                                            ("TORCHYARD_JWT_AUDIENCE", self.jwt_audience))
                   if not value]
        if missing:
            raise ValueError(f"{' and '.join(missing)}: required when JWTs are accepted "
                             "(TORCHYARD_JWT_JWKS_URL or TORCHYARD_JWT_JWKS_FILE is set)")
        return self

    @property
    def jwt_enabled(self) -> bool:
        return self.jwt_jwks_url is not None or self.jwt_jwks_file is not None


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
