"""How ``python -m bench`` prints its figures (one table, then latency, history, soak and
with / without keys lines) and writes them as JSON (``--json PATH``), so runs can be compared.

Only formatting: the figures come from ``bench/suite.py``, which measures and verifies them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MISSING = "n/a"


def number(value: float | None, digits: int = 0) -> str:
    """``value`` with thousands separators, or n/a."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.{digits}f}"


def percent(value: float | None) -> str:
    """``value`` (a fraction) as a whole percentage, or n/a."""
    return MISSING if value is None else f"{100 * value:.0f}%"


def pair(left: str, right: str) -> str:
    """Two figures side by side, jobq first."""
    return f"{left} / {right}"


def table(rows: Sequence[Mapping[str, Any]], *, with_calls: bool, with_peers: bool = False) -> str:
    """The comparison table: one line per workload row (medians over its rounds).

    ``with_peers`` adds PGQueuer's jobs/s and jobq ÷ PGQueuer after the raw-SQL columns.
    """
    columns = [
        ("workload", "<"),
        ("jobq jobs/s", ">"),
        ("raw jobs/s", ">"),
        ("jobq÷raw", ">"),
    ]
    if with_peers:
        columns += [("PGQueuer jobs/s", ">"), ("jobq÷PGQueuer", ">")]
    columns += [
        ("server CPU ms/req", ">"),
        ("client CPU jobq / raw", ">"),
        ("commits/job jobq / raw", ">"),
        ("xids/job jobq / raw", ">"),
    ]
    if with_calls:
        columns.append(("calls/job jobq / raw", ">"))
    lines: list[list[str]] = []
    for row in rows:
        jobq, raw = row.get("jobq") or {}, row.get("raw") or {}
        line = [
            row["label"],
            number(jobq.get("jobs_per_s")),
            number(raw.get("jobs_per_s")),
            number(row.get("ratio"), 3),
        ]
        if with_peers:
            pgqueuer = row.get("pgqueuer") or {}
            line += [number(pgqueuer.get("jobs_per_s")), number(row.get("ratio_pgqueuer"), 3)]
        line += [
            number(jobq.get("server_cpu_ms_per_request"), 2),
            pair(percent(jobq.get("client_cpu_share")), percent(raw.get("client_cpu_share"))),
            pair(number(jobq.get("commits_per_job"), 2), number(raw.get("commits_per_job"), 2)),
            pair(number(jobq.get("xids_per_job"), 2), number(raw.get("xids_per_job"), 2)),
        ]
        if with_calls:
            line.append(
                pair(number(jobq.get("calls_per_job"), 2), number(raw.get("calls_per_job"), 2))
            )
        lines.append(line)
    return grid(columns, lines)


def grid(columns: Sequence[tuple[str, str]], lines: Sequence[Sequence[str]]) -> str:
    """A header of ``(title, alignment)`` columns, a rule, and one line per row of cells."""
    widths = [
        max(len(title), *(len(line[i]) for line in lines)) if lines else len(title)
        for i, (title, _) in enumerate(columns)
    ]

    def render(cells: Sequence[str]) -> str:
        return "  ".join(
            f"{cell:{align}{width}}"
            for cell, (_, align), width in zip(cells, columns, widths, strict=True)
        ).rstrip()

    header = render([title for title, _ in columns])
    return "\n".join([header, "-" * len(header), *(render(line) for line in lines)])


def latency_line(label: str, figures: Mapping[str, Any]) -> str:
    """``label: p50 .. ms  p99 .. ms  (n=..)``."""
    return (
        f"{label}: p50 {number(figures.get('p50_ms'), 2)} ms  "
        f"p99 {number(figures.get('p99_ms'), 2)} ms  (n={figures.get('n', 0)})"
    )


def signed(value: float | None, digits: int = 2) -> str:
    """``value`` with its sign (+0.03), or n/a."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:+.{digits}f}"


def auth_lines(auth: Mapping[str, Any]) -> list[str]:
    """The block comparing claim and complete latency (and server CPU) without and with keys."""
    without, with_keys = auth.get("without_keys") or {}, auth.get("with_keys") or {}
    delta = auth.get("delta_ms") or {}
    waited = [s for s in auth.get("auth_on_seconds") or [] if s is not None]
    turned_on = (
        f"authentication on {max(waited):.2f} s after the key committed" if waited else "never on"
    )
    lines = [
        f"claim and complete, 1 client, {auth['jobs']:,} jobs per run, median of "
        f"{auth['rounds']} round(s), without keys first; {turned_on}:"
    ]
    for what in ("claim", "complete"):
        a, b = without.get(what) or {}, with_keys.get(what) or {}
        lines.append(
            f"  {what} latency p50/p99: "
            f"{number(a.get('p50_ms'), 2)}/{number(a.get('p99_ms'), 2)} ms without keys, "
            f"{number(b.get('p50_ms'), 2)}/{number(b.get('p99_ms'), 2)} ms with keys "
            f"({signed(delta.get(f'{what}_p50'))} ms p50)"
        )
    lines.append(
        "  server CPU per request: "
        f"{number(without.get('server_cpu_ms_per_request'), 3)} ms without keys, "
        f"{number(with_keys.get('server_cpu_ms_per_request'), 3)} ms with keys "
        f"({signed(delta.get('server_cpu_per_request'), 3)} ms)"
    )
    return lines


def megabytes(value: float) -> str:
    """Bytes as MB with one decimal."""
    return f"{value / 2**20:.1f} MB"


def write_json(path: Path, document: Mapping[str, Any]) -> None:
    """Writes the figures of a run to ``path`` (indented, keys in insertion order)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(document, indent=2) + "\n")
