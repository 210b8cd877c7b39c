"""The committed openapi.json is the contract: it must equal what the app generates."""

from __future__ import annotations

import json
from pathlib import Path

from app.cli import openapi_document

ROOT = Path(__file__).resolve().parents[2]


def test_committed_openapi_matches_app() -> None:
    committed = json.loads((ROOT / "openapi.json").read_text(encoding="utf-8"))
    assert committed == openapi_document(), (
        "openapi.json is stale: regenerate it with `jobq openapi > openapi.json`"
    )


def test_contract_names_every_endpoint() -> None:
    paths = openapi_document()["paths"]
    for path in (
        "/v1/jobs",
        "/v1/jobs/batch",
        "/v1/jobs/{job_id}",
        "/v1/jobs/{job_id}/cancel",
        "/v1/jobs/{job_id}/retry",
        "/v1/claim",
        "/v1/heartbeat",
        "/v1/complete",
        "/v1/fail",
        "/v1/release",
        "/v1/queues",
        "/v1/workers",
        "/healthz",
        "/readyz",
    ):
        assert path in paths, path
