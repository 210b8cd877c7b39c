"""How ``python -m bench`` prints its figures (the rows' jobs/s and their costs, then latency,
history, soak and with / without keys lines) and writes them as JSON (``--json PATH``), so runs
can be compared.

Only formatting: the figures come from ``bench/suite.py``, which measures and verifies them.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

MISSING = "n/a"
NOT_RUN = "\N{EN DASH}"  # the target does not run this row (the notes under the table say why)


def number(value: float | None, digits: int = 0) -> str:
    """``value`` with thousands separators, or n/a."""
    if value is None or not math.isfinite(value):
        return MISSING
    return f"{value:,.{digits}f}"


def percent(value: float | None) -> str:
    """``value`` (a fraction) as a whole percentage, or n/a."""
    return MISSING if value is None else f"{100 * value:.0f}%"


def pair(left: str, *right: str) -> str:
    """Figures side by side, jobq first."""
    return " / ".join((left, *right))


def jobs_cell(row: Mapping[str, Any], target: str) -> str:
    """``target``'s jobs/s in ``row``; a dash when it does not run the row."""
    figures = row.get(target)
    return NOT_RUN if figures is None else number(figures.get("jobs_per_s"))


def ratio_cell(row: Mapping[str, Any], key: str, *targets: str) -> str:
    """The ratio ``key`` of ``row``; a dash when one of ``targets`` does not run the row."""
    if any(row.get(target) is None for target in targets):
        return NOT_RUN
    return number(row.get(key), 3)


def table(
    rows: Sequence[Mapping[str, Any]],
    *,
    with_calls: bool,
    peers: Sequence[tuple[str, str]] = (),
) -> str:
    """The two tables, one line per workload row each (medians over its rounds): jobs/s with
    the ratios, then what each job cost.

    ``peers`` (name, title) adds each peer's jobs/s and jobq ÷ that peer to the first.
    """
    return throughput(rows, peers=peers) + "\n\n" + costs(rows, with_calls=with_calls)


def throughput(rows: Sequence[Mapping[str, Any]], *, peers: Sequence[tuple[str, str]] = ()) -> str:
    """jobq's, raw SQL's on jobq's schema and on the lean table, each peer's jobs/s; the ratios."""
    columns = [
        ("workload", "<"),
        ("jobq jobs/s", ">"),
        ("schema jobs/s", ">"),
        ("lean jobs/s", ">"),
        ("jobq÷lean", ">"),
        ("jobq÷schema", ">"),
        ("schema÷lean", ">"),
    ]
    for _, title in peers:
        columns += [(f"{title} jobs/s", ">"), (f"jobq÷{title}", ">")]
    lines: list[list[str]] = []
    for row in rows:
        line = [
            row["label"],
            jobs_cell(row, "jobq"),
            jobs_cell(row, "raw"),
            jobs_cell(row, "lean"),
            ratio_cell(row, "ratio_lean", "lean"),
            ratio_cell(row, "ratio", "raw"),
            ratio_cell(row, "ratio_raw_lean", "lean"),
        ]
        for name, _ in peers:
            line += [jobs_cell(row, name), ratio_cell(row, f"ratio_{name}", name)]
        lines.append(line)
    return grid(columns, lines)


def costs(rows: Sequence[Mapping[str, Any]], *, with_calls: bool) -> str:
    """Per row: the servers' CPU per request, the load process's CPU, commits, xids (and
    statement calls) per job, of jobq, raw SQL on its schema and, where read, on the lean table."""
    columns = [
        ("workload", "<"),
        ("server CPU ms/req", ">"),
        ("client CPU jobq / schema / lean", ">"),
        ("commits/job jobq / schema", ">"),
        ("xids/job jobq / schema / lean", ">"),
    ]
    if with_calls:
        columns.append(("calls/job jobq / schema", ">"))
    lines: list[list[str]] = []
    for row in rows:
        jobq, raw = row.get("jobq") or {}, row.get("raw") or {}
        lean = row.get("lean")
        line = [
            row["label"],
            number(jobq.get("server_cpu_ms_per_request"), 2),
            pair(
                percent(jobq.get("client_cpu_share")),
                percent(raw.get("client_cpu_share")),
                NOT_RUN if lean is None else percent(lean.get("client_cpu_share")),
            ),
            pair(number(jobq.get("commits_per_job"), 2), number(raw.get("commits_per_job"), 2)),
            pair(
                number(jobq.get("xids_per_job"), 2),
                number(raw.get("xids_per_job"), 2),
                NOT_RUN if lean is None else number(lean.get("xids_per_job"), 2),
            ),
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
