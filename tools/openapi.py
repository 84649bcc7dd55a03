"""The checked-in OpenAPI document (``docs/openapi.json``): ``python -m tools.openapi > docs/openapi.json``.

Generic: built for a server with API tokens and without this host's single-host bounds, which
only a running server's own ``/openapi.json`` states (``service.api.openapi``).
"""

import json
import tempfile
from pathlib import Path

from service.api.openapi import build_openapi
from service.api.routes import records
from service.app import create_app
from service.settings import Settings


def checked_in_document() -> str:
    """The document as checked in (``docs/openapi.json``): a server with API tokens configured
    (the deployed shape; without tokens only the ``apiToken`` scheme and requirements drop)."""
    with tempfile.TemporaryDirectory() as home:
        settings = Settings(home=Path(home), gpus="none", cpu_slots=1, api_tokens="openapi-document-token")
        app = create_app(settings, run_supervisor=False)
        # Generic: not this (local) app's single-host bounds, which only its served one states.
        document = build_openapi(app, api_tokens=True, body_models=records.BODY_MODELS)
    return json.dumps(document, indent=2, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m tools.openapi > docs/openapi.json
    print(checked_in_document(), end="")
