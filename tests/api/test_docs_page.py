"""``/docs`` works without internet: Swagger UI's page names only this service's own URLs, each
of them answers, and the page carries the dashboard's Content-Security-Policy."""

from __future__ import annotations

import re
from urllib.parse import urljoin, urlsplit

import httpx

from app.dashboard.router import CONTENT_SECURITY_POLICY

CONTENT_TYPES = {".js": "text/javascript", ".css": "text/css", ".png": "image/png"}


def _referenced(page: str) -> list[str]:
    """Every URL the page loads or links to."""
    return re.findall(r"""(?:src|href)\s*=\s*["']([^"']+)["']""", page, flags=re.IGNORECASE)


async def test_docs_loads_only_same_origin_assets_that_answer(client: httpx.AsyncClient) -> None:
    page = await client.get("/docs")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert page.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
    assert page.headers["x-content-type-options"] == "nosniff"

    # No inline script: each <script> is empty and names its source.
    scripts = re.findall(r"<script([^>]*)>(.*?)</script>", page.text, flags=re.DOTALL)
    assert scripts and all("src=" in attrs and not body.strip() for attrs, body in scripts)
    assert "<style" not in page.text.lower()

    urls = _referenced(page.text)
    assert {urlsplit(u).path.rsplit(".", 1)[-1] for u in urls} >= {"js", "css"}
    for url in urls:
        parts = urlsplit(urljoin(str(page.url), url))
        assert (parts.scheme, parts.netloc) == ("http", "jobq.test"), f"{url} is not same-origin"
        asset = await client.get(url)
        assert asset.status_code == 200, url
        suffix = "." + parts.path.rsplit(".", 1)[-1]
        assert asset.headers["content-type"].startswith(CONTENT_TYPES[suffix]), (url, asset.headers)
        assert len(asset.content) > 0


async def test_the_initializer_points_swagger_ui_at_this_services_document(
    client: httpx.AsyncClient,
) -> None:
    page = (await client.get("/docs")).text
    [initializer] = [u for u in _referenced(page) if "initializer" in u]
    script = (await client.get(initializer)).text
    assert '"/openapi.json"' in script and "http" not in script
    document = await client.get("/openapi.json")
    assert document.status_code == 200 and document.json()["info"]["title"] == "jobq"


async def test_redoc_is_not_served(client: httpx.AsyncClient) -> None:
    """ReDoc needs inline styles and blob: workers the policy forbids, so it is left off."""
    assert (await client.get("/redoc")).status_code == 404
