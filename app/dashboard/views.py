"""What the dashboard's templates show, computed from service rows: ages, JSON, progress, charts.

Everything here is pure (no request, no database) and returns plain values; the templates
escape them (Jinja's autoescape is on for every template), so nothing here builds markup.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

# Throughput outcomes drawn as "failed": a failed attempt (retried later) and a final failure.
FAILED_OUTCOMES = frozenset({"failed", "dead"})


def human_seconds(seconds: float | None) -> str:
    """A duration as people say it: ``42 s``, ``3 min 12 s``, ``2 h 5 min``, ``3 d 4 h``."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    total = max(0, int(seconds))
    if total < 60:
        return f"{total} s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes} min {secs} s" if secs else f"{minutes} min"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    days, hours = divmod(hours, 24)
    return f"{days} d {hours} h" if hours else f"{days} d"


def iso(moment: datetime | None) -> str:
    """An instant as ISO 8601 in UTC (for ``datetime`` and ``data-*`` attributes), or ``""``."""
    if moment is None:
        return ""
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def utc(moment: datetime | None) -> str:
    """An instant for reading: ``2030-01-01 09:00:00 UTC``, or ``—``."""
    if moment is None:
        return "—"
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def relative(moment: datetime | None, now: datetime) -> str:
    """How far an instant is from ``now``: ``12 s ago``, ``in 3 min``, or ``—``."""
    if moment is None:
        return "—"
    delta = (moment - now).total_seconds()
    if abs(delta) < 1:
        return "now"
    return f"in {human_seconds(delta)}" if delta > 0 else f"{human_seconds(-delta)} ago"


def pretty_json(value: Any) -> str:
    """A JSON value indented for a ``<pre>`` (unicode kept; the template escapes it)."""
    return json.dumps(value, indent=2, ensure_ascii=False, default=str)


def short_json(value: Any, limit: int = 80) -> str:
    """A JSON value on one line, cut to ``limit`` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cut(text: str | None, limit: int = 80) -> str:
    """Text cut to ``limit`` characters (an ellipsis marks the cut)."""
    if not text:
        return ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


_DONE_KEYS = ("done", "current", "completed", "processed", "count")
_TOTAL_KEYS = ("total", "of", "max")
_PERCENT_KEYS = ("percent", "pct")


def progress_bar(progress: Any) -> tuple[float, float] | None:
    """A ``<progress>`` value and max from a job's progress, when it reads as one.

    Understood: ``{"done": 8, "total": 20}`` (or current / completed / processed of total),
    ``{"percent": 40}``, a fraction ``0.4`` or a percentage ``40``. Anything else: ``None``
    (the raw value is still shown).
    """
    plain = _number(progress)
    if plain is not None:
        if 0 <= plain <= 1:
            return plain, 1.0
        if 0 <= plain <= 100:
            return plain, 100.0
        return None
    if not isinstance(progress, Mapping):
        return None
    for key in _PERCENT_KEYS:
        percent = _number(progress.get(key))
        if percent is not None and 0 <= percent <= 100:
            return percent, 100.0
    done = next((n for k in _DONE_KEYS if (n := _number(progress.get(k))) is not None), None)
    total = next((n for k in _TOTAL_KEYS if (n := _number(progress.get(k))) is not None), None)
    if done is None or total is None or total <= 0 or done < 0:
        return None
    return min(done, total), total


def _instant(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value
    if isinstance(value, str):
        try:
            parsed = datetime.fromisoformat(value)
        except ValueError:
            return None
        return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)
    return None


@dataclass(frozen=True)
class JobError:
    """One entry of a job's error history (``jobs.errors``, kept by job_fail and job_reap)."""

    attempt: Any
    at: datetime | None
    worker_id: str | None
    kind: str | None
    message: str


def job_errors(errors: Any) -> list[JobError]:
    """A job's error history, oldest first; entries of an unknown shape are shown as JSON."""
    if not isinstance(errors, list):
        return []
    out: list[JobError] = []
    for entry in errors:
        if isinstance(entry, Mapping):
            message = entry.get("error")
            worker = entry.get("worker_id")
            kind = entry.get("kind")
            out.append(
                JobError(
                    attempt=entry.get("attempt"),
                    at=_instant(entry.get("at")),
                    worker_id=str(worker) if worker is not None else None,
                    kind=str(kind) if kind is not None else None,
                    message=message if isinstance(message, str) else short_json(message, 2000),
                )
            )
        else:
            out.append(JobError(None, None, None, None, short_json(entry, 2000)))
    return out


@dataclass(frozen=True)
class TimelineEvent:
    """One moment of a job's life."""

    at: datetime
    what: str
    kind: str  # created, scheduled, started, error, checkpoint, finished


def timeline(job: Mapping[Any, Any]) -> list[TimelineEvent]:
    """A job's attempts in order: created, due, errors by attempt, last start, checkpoint, end."""
    events: list[TimelineEvent] = [TimelineEvent(job["created_at"], "created", "created")]
    run_at: datetime | None = job.get("run_at")
    if run_at is not None and run_at - job["created_at"] > timedelta(seconds=1):
        label = "due" if job["status"] != "scheduled" else "due (scheduled)"
        events.append(TimelineEvent(run_at, label, "scheduled"))
    for error in job_errors(job.get("errors")):
        if error.at is not None:
            who = f" on {error.worker_id}" if error.worker_id else ""
            events.append(
                TimelineEvent(
                    error.at,
                    f"attempt {error.attempt} {error.kind or 'failed'}{who}: {cut(error.message)}",
                    "error",
                )
            )
    started: datetime | None = job.get("started_at")
    if started is not None:
        worker = f" by {job['worker_id']}" if job.get("worker_id") else ""
        events.append(
            TimelineEvent(started, f"attempt {job['attempts']} started{worker}", "started")
        )
    checkpoint_at: datetime | None = job.get("checkpoint_at")
    if checkpoint_at is not None:
        events.append(TimelineEvent(checkpoint_at, "checkpoint saved", "checkpoint"))
    finished: datetime | None = job.get("finished_at")
    if finished is not None:
        events.append(TimelineEvent(finished, f"finished: {job['status']}", "finished"))
    return sorted(events, key=lambda e: e.at)


@dataclass(frozen=True)
class Bar:
    """One minute of the throughput chart: a succeeded column with the failed stacked on it."""

    x: float
    width: float
    ok_y: float
    ok_height: float
    failed_y: float
    failed_height: float
    label: str


@dataclass(frozen=True)
class Chart:
    """The throughput chart's geometry (an inline SVG), in the SVG's own units."""

    width: int
    height: int
    left: int
    top: int
    plot_width: int
    plot_height: int
    bars: list[Bar]
    y_max: int
    succeeded: int
    failed: int
    minutes: int

    @property
    def y_mid_label(self) -> str:
        """The label of the middle grid line (half of ``y_max``)."""
        half = self.y_max / 2
        return str(int(half)) if half.is_integer() else f"{half:g}"


def _nice_ceiling(value: int) -> int:
    """The smallest 1, 2 or 5 times a power of ten that is at least ``value`` (at least 1)."""
    if value <= 1:
        return 1
    magnitude: int = 10 ** (len(str(value)) - 1)
    for step in (1, 2, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude  # never reached


def throughput_chart(
    rows: Iterable[Mapping[Any, Any]],
    *,
    now: datetime,
    visible: Callable[[str], bool],
    minutes: int = 60,
) -> Chart:
    """Per-minute succeeded and failed jobs of the visible queues over the last ``minutes``."""
    width, height, left, top, bottom, right = 720, 180, 44, 10, 22, 6
    plot_width, plot_height = width - left - right, height - top - bottom
    kept = [r for r in rows if visible(r["queue"])]
    end = now.astimezone(UTC).replace(second=0, microsecond=0)
    if kept:
        end = max(end, *(r["minute"].astimezone(UTC) for r in kept))
    ok = [0] * minutes
    failed = [0] * minutes
    for row in kept:
        slot = minutes - 1 - int((end - row["minute"].astimezone(UTC)).total_seconds() // 60)
        if not 0 <= slot < minutes:
            continue
        if row["outcome"] == "succeeded":
            ok[slot] += int(row["jobs"])
        elif row["outcome"] in FAILED_OUTCOMES:
            failed[slot] += int(row["jobs"])
    y_max = _nice_ceiling(max((a + b for a, b in zip(ok, failed, strict=True)), default=0))
    slot_width = plot_width / minutes
    bars: list[Bar] = []
    for i in range(minutes):
        ok_height = plot_height * ok[i] / y_max
        failed_height = plot_height * failed[i] / y_max
        base = top + plot_height
        minute = end - timedelta(minutes=minutes - 1 - i)
        bars.append(
            Bar(
                x=round(left + i * slot_width + slot_width * 0.125, 2),
                width=round(slot_width * 0.75, 2),
                ok_y=round(base - ok_height, 2),
                ok_height=round(ok_height, 2),
                failed_y=round(base - ok_height - failed_height, 2),
                failed_height=round(failed_height, 2),
                label=f"{minute:%H:%M} UTC: {ok[i]} succeeded, {failed[i]} failed",
            )
        )
    return Chart(
        width=width,
        height=height,
        left=left,
        top=top,
        plot_width=plot_width,
        plot_height=plot_height,
        bars=bars,
        y_max=y_max,
        succeeded=sum(ok),
        failed=sum(failed),
        minutes=minutes,
    )


def state_totals(
    stats: Sequence[Mapping[str, Any]], states: Sequence[str], *, queue: str | None
) -> dict[str, int]:
    """Jobs per state summed over the given queue-stats rows (one queue, or all of them)."""
    totals = dict.fromkeys(states, 0)
    for row in stats:
        if queue is not None and row["name"] != queue:
            continue
        for state in states:
            totals[state] += int(row[state])
    return totals
