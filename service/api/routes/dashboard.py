"""The dashboard's static shell: ``/`` and ``/static/<file>``. Public by design: it holds no data;
the page's script calls the API with the user's token.

plotly.js is the copy shipped inside the installed ``plotly`` Python package, so the dashboard works
offline and its chart library is upgraded with pip like every other dependency.
"""

import importlib.util
from functools import cache
from pathlib import Path

from fastapi import APIRouter
from fastapi.responses import FileResponse

from service.api.errors import ApiError

router = APIRouter(tags=["dashboard"], include_in_schema=False)
DASHBOARD_DIR = Path(__file__).resolve().parents[2] / "dashboard"
# Whitelisted by name: no path from the URL ever reaches the file system.
ASSETS = {
    "app.js": "text/javascript", "style.css": "text/css", "docs.js": "text/javascript",
    "widgets.js": "text/javascript", "sweeps.js": "text/javascript", "compare.js": "text/javascript",
    "resources.js": "text/javascript", "jobextras.js": "text/javascript",
    "teams.js": "text/javascript",
    "pages.css": "text/css", "favicon.svg": "image/svg+xml",
}
PLOTLY_JS = "plotly.min.js"
# The app's own files change with the server: revalidate (FileResponse sends an ETag). plotly.js
# changes only with the plotly package: cache it for a day.
# The page may not be framed (clickjacking the cancel button) and runs only its own files;
# plotly.js injects <style> elements, hence 'unsafe-inline' for styles only.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data: blob:; connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; "
    "form-action 'self'; object-src 'none'"
)
SHELL_HEADERS = {
    "Content-Security-Policy": CONTENT_SECURITY_POLICY,
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}
REVALIDATE = {"Cache-Control": "no-cache", **SHELL_HEADERS}
CACHE_DAY = {"Cache-Control": "public, max-age=86400", **SHELL_HEADERS}


@cache
def plotly_js_path() -> Path | None:
    """``plotly/package_data/plotly.min.js`` of the installed package, found without importing it."""
    spec = importlib.util.find_spec("plotly")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / "package_data" / PLOTLY_JS
    return path if path.is_file() else None


@router.api_route("/", methods=["GET", "HEAD"])
def index() -> FileResponse:
    return FileResponse(DASHBOARD_DIR / "index.html", media_type="text/html", headers=REVALIDATE)


@router.api_route("/static/{name}", methods=["GET", "HEAD"])
def static_file(name: str) -> FileResponse:
    if name == PLOTLY_JS:
        path = plotly_js_path()
        if path is None:
            raise ApiError(404, "not_found", "plotly.min.js: the plotly package is not installed")
        return FileResponse(path, media_type="text/javascript", headers=CACHE_DAY)
    if name not in ASSETS:
        allowed = ", ".join([*ASSETS, PLOTLY_JS])
        raise ApiError(404, "not_found", f"static file {name!r} not found; files: {allowed}")
    return FileResponse(DASHBOARD_DIR / name, media_type=ASSETS[name], headers=REVALIDATE)
