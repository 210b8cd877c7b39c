"""Failures (``/dashboard/failures``): recent failures grouped by cause; retry or cancel a group.

A group is keyed by queue, job type, error type and fingerprint (its traceback's frames, or its
masked message: app/domain/fingerprints.py). A group's action is confirmed first: the
confirmation shows the group as the grouping has it now (read again, not from the link) and
lists its jobs as they are then, and the action acts on exactly those (each if it is still in a
state the action takes).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict
from urllib.parse import urlencode

from fastapi import Response

from app.dashboard.base import PREFIX
from app.dashboard.board import OBSERVE, READ_OPERATE, Call, Route
from app.dashboard.session import Flash
from app.domain.states import BulkAction, bulk_states
from app.domain.types import JobSearch
from app.queue.history import FailureKey

# The windows offered, in seconds, with their labels; the first is the default.
WINDOWS = ((86_400, "24 hours"), (3_600, "1 hour"), (7 * 86_400, "7 days"))
GROUP_JOBS_MAX = 10_000
_DONE = {BulkAction.RETRY: "Retried", BulkAction.CANCEL: "Cancelled"}


def _window(params: Mapping[str, str]) -> int:
    text = params.get("window", "")
    return next((w for w, _ in WINDOWS if str(w) == text), WINDOWS[0][0])


async def failures(call: Call) -> Response:
    """Failure groups of the chosen window, largest first."""
    window = _window(call.request.query_params)
    found = await call.services.history.failures(
        window_seconds=window, queue_patterns=call.caller.principal.like_patterns()
    )
    groups = []
    for g in found.groups:
        key = {
            "queue": g.queue,
            "type": g.type,
            "error_type": g.error_type,
            "fingerprint": g.fingerprint,
            "window": str(window),
        }
        groups.append({**asdict(g), "culprit": g.culprit, "key": urlencode(key)})
    return call.page(
        "failures",
        nav="failures",
        groups=groups,
        window=window,
        windows=WINDOWS,
        scanned=found.scanned,
        truncated=found.truncated,
    )


def _group(call: Call, fields: Mapping[str, str]) -> tuple[BulkAction, FailureKey, int]:
    action_text = fields.get("action", "")
    if action_text not in (BulkAction.RETRY.value, BulkAction.CANCEL.value):
        raise call.refuse(400, "Choose retry or cancel.")
    names = ("queue", "type", "error_type", "fingerprint")
    if any(not fields.get(name) for name in names):
        raise call.refuse(400, "Name the failure group: queue, type, error_type and fingerprint.")
    if not call.caller.principal.covers(fields["queue"]):
        raise call.refuse(403, f"This key does not cover queue {fields['queue']!r}.")
    key = FailureKey(
        queue=fields["queue"],
        type=fields["type"],
        error_type=fields["error_type"],
        fingerprint=fields["fingerprint"],
    )
    return BulkAction(action_text), key, _window(fields)


async def group_confirm(call: Call) -> Response:
    """The confirmation of a group action: the group's jobs it would change now, listed."""
    action, key, window = _group(call, call.request.query_params)
    statuses = [s.value for s in bulk_states(action, None) or ()]
    ids = await call.services.history.failure_group_jobs(
        key, window_seconds=window, statuses=statuses, limit=GROUP_JOBS_MAX
    )
    shown = await call.services.history.failure_group(key, window_seconds=window)
    return call.render(
        "failures_confirm.html",
        nav="failures",
        action=action.value,
        group=key,
        shown=shown,
        window=window,
        ids=ids,
        touched=statuses,
    )


async def group_run(call: Call) -> Response:
    """Runs a confirmed group action on the confirmed jobs; back with how many it changed."""
    action, key, window = _group(call, call.form)
    try:
        ids = tuple(int(i) for i in call.form.get("ids", "").split(",") if i)
    except ValueError:
        raise call.refuse(400, "The confirmed jobs are malformed; confirm again.") from None
    if not ids or len(ids) > GROUP_JOBS_MAX:
        raise call.refuse(400, "No jobs were confirmed.")
    principal = call.caller.principal
    outcome = await call.services.ops.bulk(
        action,
        JobSearch(queue=key.queue, type=key.type, ids=ids),
        actor=principal.name,
        actor_key_id=principal.key_id,
    )
    noun = "job" if outcome.changed == 1 else "jobs"
    moved = len(ids) - outcome.changed
    note = f" ({moved} had changed state meanwhile)" if moved else ""
    return call.redirect(
        f"{PREFIX}/failures?window={window}",
        Flash("ok", f"{_DONE[action]} {outcome.changed} {noun}{note}"),
    )


ROUTES = (
    Route("GET", f"{PREFIX}/failures", failures, OBSERVE),
    Route("GET", f"{PREFIX}/fragments/failures", failures, OBSERVE),
    Route("GET", f"{PREFIX}/failures/group", group_confirm, READ_OPERATE),
    Route("POST", f"{PREFIX}/failures/group", group_run, READ_OPERATE, action=True),
)
