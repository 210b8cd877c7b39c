"""Every metric the service can expose is in docs/operating/metrics.md's table.

Two ways to find them, so neither a family that is only yielded in some states nor one built
outside the collector's module slips through: every family one scrape of a live app declares
(``# TYPE`` lines, written for a family even before it has a sample), and every ``jobq_*`` name
app/api/metrics.py hands a metric family. A counter is documented by its sample name
(``_total``), as Prometheus queries it.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
PAGE = ROOT / "docs" / "operating" / "metrics.md"
FAMILIES = {"CounterMetricFamily", "GaugeMetricFamily", "HistogramMetricFamily"}
HISTOGRAM_HELPERS = {"_histogram"}  # the collector's own builder of a per-queue histogram


def documented() -> set[str]:
    """The metric names the page's table rows start with (a row may name several)."""
    names: set[str] = set()
    for line in PAGE.read_text(encoding="utf-8").splitlines():
        if line.startswith("| `jobq_"):
            first_cell = line.split("|")[1]
            names.update(re.findall(r"`(jobq_[a-z_]+)`", first_cell))
    return names


def sample_name(name: str, kind: str) -> str:
    return f"{name}_total" if kind == "counter" and not name.endswith("_total") else name


def declared_in_source() -> set[str]:
    """The families app/api/metrics.py builds: (name, kind) read from the constructor calls."""
    tree = ast.parse((ROOT / "app" / "api" / "metrics.py").read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if not (
            isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
        ):
            continue
        name = str(node.args[0].value)
        if not name.startswith("jobq_"):
            continue
        if isinstance(node.func, ast.Name) and node.func.id in FAMILIES:
            found.add(sample_name(name, node.func.id.removesuffix("MetricFamily").lower()))
        elif isinstance(node.func, ast.Attribute) and node.func.attr in HISTOGRAM_HELPERS:
            found.add(name)
    return found


async def test_every_family_a_scrape_declares_is_documented(client: httpx.AsyncClient) -> None:
    answer = await client.post("/v1/jobs", json={"queue": "documented", "type": "t"})
    assert answer.status_code == 201, answer.text
    scraped = await client.get("/metrics")
    assert scraped.status_code == 200
    declared = {
        sample_name(name, kind)
        for name, kind in re.findall(r"^# TYPE (jobq_\w+) (\w+)$", scraped.text, re.MULTILINE)
    }
    assert len(declared) >= 20
    assert sorted(declared - documented()) == [], "exposed, not in docs/operating/metrics.md"


def test_every_family_the_collector_builds_is_documented() -> None:
    built = declared_in_source()
    assert "jobq_job_events_total" in built and "jobq_build_info" in built
    assert sorted(built - documented()) == [], "built in app/api/metrics.py, not documented"


def test_the_page_documents_nothing_that_does_not_exist() -> None:
    assert sorted(documented() - declared_in_source()) == []
