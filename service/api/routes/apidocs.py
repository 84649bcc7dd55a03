"""The API reference: ``/docs`` (Swagger UI) and its assets under ``/static/swagger/<file>``.

Public like the dashboard shell: the page holds no data. Its script reads ``/openapi.json`` and
calls the API with the token the dashboard keeps (``localStorage["torchyard.token"]``), so one
pasted token serves both pages. Swagger UI is the copy shipped inside the installed
``fastapi-offline`` package: it opens without internet and is upgraded with pip.
"""

import importlib.util
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from service.api.errors import ApiError
from service.api.routes.dashboard import DASHBOARD_DIR, REVALIDATE

router = APIRouter(tags=["docs"], include_in_schema=False)
# Whitelisted by name: no path from the URL ever reaches the file system.
SWAGGER_ASSETS = {
    "swagger-ui-bundle.js": "text/javascript",
    "swagger-ui.css": "text/css",
    "favicon.png": "image/png",
}
CACHE_DAY = {"Cache-Control": "public, max-age=86400"}


@cache
def swagger_dir() -> Path | None:
    """``fastapi_offline/static`` of the installed package, found without importing it."""
    spec = importlib.util.find_spec("fastapi_offline")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "static"
    return path if (path / "swagger-ui-bundle.js").is_file() else None


@router.api_route("/docs", methods=["GET", "HEAD"])
def docs_page() -> FileResponse:
    return FileResponse(DASHBOARD_DIR / "docs.html", media_type="text/html", headers=REVALIDATE)


@router.api_route("/static/swagger/{name}", methods=["GET", "HEAD"])
def swagger_asset(name: str) -> FileResponse:
    folder = swagger_dir()
    if name not in SWAGGER_ASSETS or folder is None:
        allowed = ", ".join(SWAGGER_ASSETS)
        raise ApiError(404, "not_found", f"swagger asset {name!r} not found; files: {allowed}")
    return FileResponse(folder / name, media_type=SWAGGER_ASSETS[name], headers=CACHE_DAY)
