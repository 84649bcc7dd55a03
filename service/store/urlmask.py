"""URLs as they may be printed or logged: without the password a database URL (or any URL with
``user:password@``) carries."""

import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

MASK = "***"
# user:password@ after the scheme's //, for what SQLAlchemy cannot parse.
_USERINFO = re.compile(r"(//[^/?#@:]*:)[^/?#@]*@")


def masked_url(url: str) -> str:
    """``url`` with its password replaced by ``***`` (``postgresql+psycopg://u:***@db/x``);
    a URL without one is unchanged."""
    try:
        parsed = make_url(url)
    except (ArgumentError, ValueError):
        return _USERINFO.sub(rf"\g<1>{MASK}@", url)
    return parsed.render_as_string(hide_password=True) if parsed.password else url
