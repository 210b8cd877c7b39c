"""Hostile job data renders escaped; pages carry a strict CSP; assets are local and cached."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

from fastapi import FastAPI

from app.dashboard import router as dashboard
from tests.api.dashboard import HOSTILE, DashboardKeys, Seeded, api, page_token, signed_in
from tests.api.helpers import claim

ESCAPED = "&lt;script&gt;alert(&#39;owned&#39;)&lt;/script&gt;"
DASHBOARD = Path(dashboard.__file__).parent


async def test_hostile_payloads_errors_results_and_worker_ids_render_escaped(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with api(app, dashboard_keys.admin) as client:
        await client.post("/v1/jobs", json={"queue": "grim", "type": "t", "payload": [HOSTILE]})
        await claim(client, worker=HOSTILE, queues=["grim"], lease_seconds=300)
    async with signed_in(app, dashboard_keys.admin) as admin:
        token = await page_token(admin)
        # A bulk action whose search (audited with it) carries hostile text.
        bulk = await admin.post(
            "/dashboard/jobs/bulk",
            data={
                "csrf": token,
                "action": "cancel",
                "payload": f'{{"html": "{HOSTILE}"}}'.replace("'", "\\u0027"),
            },
        )
        assert bulk.status_code == 303, bulk.text
        pages = {
            "jobs": "/dashboard/jobs",
            "jobs by type": f"/dashboard/jobs?type=t{HOSTILE}",
            "hostile job": f"/dashboard/jobs/{seeded.hostile}",
            "dead job": f"/dashboard/jobs/{seeded.dead}",
            "succeeded job": f"/dashboard/jobs/{seeded.succeeded}",
            "workers": "/dashboard/workers",
            "audit": "/dashboard/audit",
            "bulk confirmation": f"/dashboard/jobs/bulk?action=retry&type=t{HOSTILE}",
            "filter error": f"/dashboard/jobs?payload={HOSTILE}",
        }
        for what, path in pages.items():
            answer = await admin.get(path)
            assert answer.status_code in (200, 400), (what, answer.status_code)
            assert HOSTILE not in answer.text, what
            assert "<script>alert" not in answer.text, what
            assert "&lt;script&gt;" in answer.text, what
        job = (await admin.get(f"/dashboard/jobs/{seeded.hostile}")).text
        assert f'id="job-payload">{{\n  &#34;html&#34;: &#34;{ESCAPED}&#34;' in job
        dead = (await admin.get(f"/dashboard/jobs/{seeded.dead}")).text
        assert f"attempt 2 broke: {ESCAPED}" in dead
        workers = (await admin.get("/dashboard/workers")).text
        assert f'data-worker-id="{ESCAPED}"' in workers


async def test_every_page_carries_a_strict_content_security_policy(
    app: FastAPI, dashboard_keys: DashboardKeys, seeded: Seeded
) -> None:
    async with signed_in(app, dashboard_keys.admin) as admin:
        for path in (
            "/dashboard",
            "/dashboard/jobs",
            f"/dashboard/jobs/{seeded.running}",
            "/dashboard/workers",
            "/dashboard/audit",
            "/dashboard/login",
            "/dashboard/jobs/999999",
            "/dashboard/nowhere",
        ):
            answer = await admin.get(path)
            policy = answer.headers["content-security-policy"]
            assert "script-src 'self'" in policy and "style-src 'self'" in policy, path
            assert "unsafe-inline" not in policy and "unsafe-eval" not in policy, path
            assert "frame-ancestors 'none'" in policy, path
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["cache-control"] == "no-store"
            assert answer.headers["content-type"].startswith("text/html")
            # No inline script, no inline style element, no style attribute.
            assert not re.search(r"<script(?![^>]*\bsrc=)", answer.text), path
            assert "<style" not in answer.text and " style=" not in answer.text, path


async def test_static_assets_are_served_with_caching_headers(
    app: FastAPI, dashboard_keys: DashboardKeys
) -> None:
    async with signed_in(app, dashboard_keys.viewer) as viewer:
        page = (await viewer.get("/dashboard")).text
        linked = re.findall(r'(?:src|href)="(/dashboard/static/[^"]+)"', page)
        assert {u.split("?")[0].rsplit("/", 1)[1] for u in linked} == {
            "dashboard.css",
            "htmx.min.js",
            "dashboard.js",
            "favicon.png",
        }
        for url in linked:
            answer = await viewer.get(url)
            assert answer.status_code == 200, url
            assert answer.headers["cache-control"] == "public, max-age=31536000, immutable"
            assert answer.headers["etag"]
            assert answer.headers["x-content-type-options"] == "nosniff"
        plain = await viewer.get("/dashboard/static/htmx.min.js")
        assert plain.headers["cache-control"] == "public, max-age=0, must-revalidate"
        assert plain.headers["content-type"].startswith(
            ("text/javascript", "application/javascript")
        )
        assert plain.text.startswith("/*! htmx 2.") and "Zero-Clause BSD" in plain.text[:400]
        css = await viewer.get("/dashboard/static/dashboard.css")
        assert css.headers["content-type"].startswith("text/css")
        revalidated = await viewer.get(
            "/dashboard/static/dashboard.css", headers={"If-None-Match": css.headers["etag"]}
        )
        assert revalidated.status_code == 304
        assert (await viewer.get("/dashboard/static/nothing.js")).status_code == 404
        assert (await viewer.get("/dashboard/static/../router.py")).status_code == 404


def _code_of(path: Path) -> str:
    """A file's text without its comments (and so without the vendored licence header)."""
    text = path.read_text(encoding="utf-8")
    if path.suffix in {".js", ".css"}:
        text = re.sub(r"/\*.*?\*/", "", text, flags=re.DOTALL)
    if path.suffix == ".js":
        text = re.sub(r"^\s*//.*$", "", text, flags=re.MULTILINE)
    if path.suffix == ".html":
        text = re.sub(r"\{#.*?#\}", "", text, flags=re.DOTALL)
        text = re.sub(r"<!--.*?-->", "", text, flags=re.DOTALL)
    return text


def test_no_template_or_static_file_points_outside_the_service() -> None:
    files = [
        p for p in DASHBOARD.rglob("*") if p.is_file() and p.suffix in {".html", ".js", ".css"}
    ]
    assert {p.name for p in files} >= {"base.html", "htmx.min.js", "dashboard.js", "dashboard.css"}
    for path in files:
        code = _code_of(path)
        for scheme in ("http://", "https://", "//fonts.", "//cdn"):
            assert scheme not in code, (path.name, scheme)
        assert "@import" not in code and "@font-face" not in code, path.name
        if path.suffix == ".css":
            assert not re.search(r"url\(\s*['\"]?(?!data:)", code), path.name


def test_every_template_and_static_file_ships_in_the_package() -> None:
    """The wheel takes the app package whole: no exclusion may leave dashboard files behind.

    tests/system/packaging/test_wheel.py checks the built wheel itself.
    """
    project = tomllib.loads((DASHBOARD.parents[1] / "pyproject.toml").read_text())
    build = project["tool"]["hatch"]["build"]
    wheel = build["targets"]["wheel"]
    assert "app" in wheel["packages"]
    for config in (build, wheel):
        assert not {"exclude", "only-include", "include"} & config.keys(), config


def test_the_dashboard_is_not_in_the_openapi_document(app: FastAPI) -> None:
    assert not [p for p in app.openapi()["paths"] if p.startswith("/dashboard")]
