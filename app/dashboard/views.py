"""What the dashboard's templates show, computed from service rows: ages, JSON, progress, charts.

Everything here is pure (no request, no database) and returns plain values; the templates
escape them (Jinja's autoescape is on for every template), so nothing here builds markup.
"""

from __future__ import annotations

import json
import math
import re
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


def duration(seconds: float | None) -> str:
    """A measured duration to three figures: ``12.5 ms``, ``4.2 s``, then as
    :func:`human_seconds` from a minute on; ``—`` for none."""
    if seconds is None or not math.isfinite(seconds):
        return "—"
    if seconds < 1:
        return f"{max(seconds, 0) * 1000:.3g} ms"
    if seconds < 60:
        return f"{seconds:.3g} s"
    return human_seconds(seconds)


def share(part: int, whole: int) -> str:
    """``part`` of ``whole`` as a percentage to one decimal (``2.5 %``), or ``—`` of nothing."""
    if whole <= 0:
        return "—"
    return f"{100 * part / whole:.1f} %"


def glob_matches(pattern: str, name: str) -> bool:
    """Whether a limit's pattern matches a name: ``*`` is any run of characters, all else itself
    (as ``like_pattern`` in app/queue/flow_limits.py has PostgreSQL match it)."""
    return re.fullmatch(".*".join(re.escape(part) for part in pattern.split("*")), name) is not None


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


def exception_line(error: str | None) -> str:
    """The line of an error that says what went wrong: for a traceback sent as text, its last
    non-empty line (the exception), else the error's first line."""
    if not error:
        return ""
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].startswith("Traceback (most recent call last)") or error.lstrip().startswith(
        "Traceback"
    ):
        return lines[-1]
    return lines[0]


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
    """One entry of a job's error history (``jobs.errors``, kept by job_fail and job_reap), with
    its traceback when the job's history holds one."""

    attempt: Any
    at: datetime | None
    worker_id: str | None
    kind: str | None
    message: str  # the exception line: "Type: message" for a structured error
    traceback: str | None = None


def job_errors(errors: Any, events: Iterable[Any] = ()) -> list[JobError]:
    """A job's error history, newest first; entries of an unknown shape are shown as JSON.

    A failure's traceback lives in its history event, written by the same statement at the same
    instant as the entry: matched by that instant.
    """
    if not isinstance(errors, list):
        return []
    tracebacks = {
        e.at: e.data.get("traceback")
        for e in events
        if e.kind == "failed" and isinstance(e.data, Mapping)
    }
    out: list[JobError] = []
    for entry in errors:
        if isinstance(entry, Mapping):
            message = entry.get("error")
            text = message if isinstance(message, str) else short_json(message, 2000)
            if isinstance(entry.get("type"), str):
                text = f"{entry['type']}: {text}"
            worker = entry.get("worker_id")
            kind = entry.get("kind")
            at = _instant(entry.get("at"))
            out.append(
                JobError(
                    attempt=entry.get("attempt"),
                    at=at,
                    worker_id=str(worker) if worker is not None else None,
                    kind=str(kind) if kind is not None else None,
                    message=text,
                    traceback=tracebacks.get(at) if at is not None else None,
                )
            )
        else:
            out.append(JobError(None, None, None, None, short_json(entry, 2000)))
    out.reverse()
    return out


@dataclass(frozen=True)
class TimelineEvent:
    """One moment of a job's life, from its history (``GET /v1/jobs/{id}/events``)."""

    at: datetime
    what: str
    # The dot's colour: created, scheduled, started, progress, released, error, operator,
    # finished (a success), dead.
    kind: str
    actor: str | None = None  # who: a worker, an operator's key, or None for the service
    traceback: str | None = None


def _next_run(data: Mapping[str, Any]) -> str:
    status = data.get("status")
    if status == "dead":
        return "dead: no attempts left" if data.get("retryable", True) else "dead: not retryable"
    run_at = _instant(data.get("run_at"))
    if status == "scheduled" and run_at is not None:
        return f"retrying at {utc(run_at)}"
    return "retrying now" if status == "pending" else str(status or "")


def _progress_text(progress: Any) -> str:
    bar = progress_bar(progress)
    if bar is None:
        return short_json(progress, 80)
    done, total = bar
    return f"{100 * done / total:.0f}% ({done:g} of {total:g})"


def timeline(events: Iterable[Any]) -> list[TimelineEvent]:
    """A job's history as the job page tells it, oldest first: one line per event, with who."""
    out: list[TimelineEvent] = []
    for e in events:
        data: Mapping[str, Any] = e.data if isinstance(e.data, Mapping) else {}
        attempt = f"attempt {e.attempt}" if e.attempt is not None else "the job"
        who = e.actor
        if e.key_name and e.actor and e.key_name != e.actor:
            who = f"{e.actor} (key {e.key_name})"
        kind, what, traceback = "created", e.kind, None
        if e.kind == "enqueued":
            schedule = data.get("schedule")
            # A run has its instant (scheduled_for); a trigger's job names the schedule only.
            by = "schedule" if data.get("scheduled_for") else "a trigger of schedule"
            what = f"enqueued in {data.get('queue', '?')}" + (
                f" by {by} {schedule}" if schedule else ""
            )
        elif e.kind == "promoted":
            kind, what = "scheduled", "came due: moved to pending"
        elif e.kind == "claimed":
            where = f" via {e.instance}" if e.instance else ""
            kind, what = "started", f"{attempt} claimed by {e.actor or '?'}{where}"
        elif e.kind == "progress":
            kind, what = "progress", f"progress {_progress_text(data.get('progress'))}"
        elif e.kind == "released":
            saved = "checkpoint saved" if data.get("checkpoint_saved") else "no new checkpoint"
            delay = data.get("delay_seconds") or 0
            due = f", due again in {human_seconds(delay)}" if delay else ", pending again"
            kind, what = "released", f"{attempt} released by the worker ({saved}){due}"
        elif e.kind == "failed":
            error = data.get("error") or ""
            line = f"{data['type']}: {error}" if data.get("type") else error
            kind = "dead" if data.get("status") == "dead" else "error"
            what = f"{attempt} failed: {cut(line, 200)} — {_next_run(data)}"
            traceback = data.get("traceback")
        elif e.kind in ("lease_expired", "timed_out"):
            reason = "lease expired" if e.kind == "lease_expired" else "timed out"
            kind = "dead" if data.get("status") == "dead" else "error"
            what = f"{attempt} {reason} — {_next_run(data)}"
            who = None
        elif e.kind == "completed":
            ran = data.get("ran_seconds")
            took = f" in {human_seconds(ran)}" if isinstance(ran, int | float) else ""
            kind, what = "finished", f"{attempt} completed{took}"
        elif e.kind == "ready":
            kind = "scheduled"
            what = f"job {data.get('after', '?')} ended: moved to {data.get('status', 'pending')}"
        elif e.kind == "cancelled" and data.get("parent_id") is not None:
            kind = "dead"
            what = f"cancelled: parent job {data['parent_id']} ended {data.get('parent_status')}"
        elif e.kind == "cancelled":
            before = data.get("status_before")
            kind, what = (
                "dead",
                f"cancelled by {who or '?'}" + (f" (was {before})" if before else ""),
            )
        elif e.kind == "retried":
            kind, what = "operator", f"retried by {who or '?'} (was {data.get('status_before')})"
        elif e.kind == "run_now":
            kind, what = "operator", f"run now by {who or '?'}"
        elif e.kind == "webhook":
            kind, what = _webhook_line(data)
            who = None
        out.append(TimelineEvent(e.at, what, kind, who, traceback))
    return out


def _webhook_line(data: Mapping[str, Any]) -> tuple[str, str]:
    """One delivery attempt of the job's outcome to its callback, as the timeline tells it."""
    answer = f"HTTP {data['status_code']}" if data.get("status_code") else data.get("error", "")
    head = f"webhook attempt {data.get('delivery_attempt', '?')} to {cut(str(data.get('url')), 80)}"
    outcome = data.get("outcome")
    if outcome == "delivered":
        return "finished", f"{head}: delivered ({answer})"
    if outcome == "failed":
        return "dead", f"{head} failed for good: {cut(str(answer), 200)}"
    return (
        "error",
        f"{head} failed: {cut(str(answer), 200)} — next at {data.get('next_attempt_at')}",
    )


@dataclass(frozen=True)
class Bar:
    """One minute of the throughput chart: three columns side by side, each from the baseline:
    jobs that succeeded, failed attempts (retried later) and jobs that went dead. Not stacked:
    a stack of failures on successes reads as a failure rate, which these counts are not (one
    job may fail several attempts in a minute, then succeed)."""

    x: float
    width: float  # of one column
    ok_y: float
    ok_height: float
    failed_y: float
    failed_height: float
    dead_y: float
    dead_height: float
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
    failed: int  # failed attempts (retried later)
    dead: int
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
    """Per-minute succeeded jobs, failed attempts and dead jobs of the visible queues over the
    last ``minutes``."""
    width, height, left, top, bottom, right = 720, 180, 44, 10, 22, 6
    plot_width, plot_height = width - left - right, height - top - bottom
    kept = [r for r in rows if visible(r["queue"])]
    end = now.astimezone(UTC).replace(second=0, microsecond=0)
    if kept:
        end = max(end, *(r["minute"].astimezone(UTC) for r in kept))
    ok = [0] * minutes
    failed = [0] * minutes
    dead = [0] * minutes
    for row in kept:
        slot = minutes - 1 - int((end - row["minute"].astimezone(UTC)).total_seconds() // 60)
        if not 0 <= slot < minutes:
            continue
        series = {"succeeded": ok, "failed": failed, "dead": dead}.get(row["outcome"])
        if series is not None:
            series[slot] += int(row["jobs"])
    y_max = _nice_ceiling(max((*ok, *failed, *dead), default=0))
    slot_width = plot_width / minutes
    column = slot_width * 0.28
    base = top + plot_height
    bars: list[Bar] = []
    for i in range(minutes):
        heights = [plot_height * n / y_max for n in (ok[i], failed[i], dead[i])]
        minute = end - timedelta(minutes=minutes - 1 - i)
        bars.append(
            Bar(
                x=round(left + i * slot_width + slot_width * 0.08, 2),
                width=round(column, 2),
                ok_y=round(base - heights[0], 2),
                ok_height=round(heights[0], 2),
                failed_y=round(base - heights[1], 2),
                failed_height=round(heights[1], 2),
                dead_y=round(base - heights[2], 2),
                dead_height=round(heights[2], 2),
                label=f"{minute:%H:%M} UTC: {ok[i]} succeeded, {failed[i]} failed "
                f"attempt{'s' if failed[i] != 1 else ''}, {dead[i]} dead",
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
        dead=sum(dead),
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
