"""Per-job tokens (job tokens): made at launch, handed to ranks by environment, stored only as a hash."""

import hashlib
import secrets


def new_token() -> tuple[str, str]:
    """Return (token, sha256 hex digest); only the digest is ever stored."""
    token = secrets.token_urlsafe(32)
    return token, hash_token(token)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()

