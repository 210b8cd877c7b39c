"""Jobs (``/dashboard/jobs``): the filtered list newest first with keyset paging, and bulk actions.

The filters follow the API's rules (``app/api/filters.py``: queue names, types, the payload
filter, page positions) and become the same search through :func:`~app.api.filters.job_search`;
only the wording differs: each problem is a sentence for the form, all of them at once.

Bulk actions come two ways, each confirmed first: on every job of the filter (the confirmation
counts them, and the result says how the count moved meanwhile), or on jobs picked one by one
(``/jobs/picked``: the confirmation lists the picked jobs the action applies to, by their state
then, and the action changes exactly those, each if it is still in that state).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlencode

from fastapi import Response

from app.api.filters import is_cursor, is_job_type, is_queue_name, job_search, payload_filter
from app.dashboard import views
from app.dashboard.base import PAGE_SIZE, PREFIX, STATES, input_problem, status_of
from app.dashboard.board import READ, READ_OPERATE, Call, Route
from app.dashboard.session import Flash
from app.domain.bounds import instant_in_window, valid_id
from app.domain.states import (
    BULK_STATES,
    BulkAction,
    JobState,
    JobStatus,
    bulk_states,
    bulk_states_allowed,
)
from app.domain.types import JobSearch
from app.errors import Forbidden, InvalidInput
from app.settings import Settings

# Actions the jobs page offers on a whole filter (the service also knows delete).
BULK_OFFERED: tuple[BulkAction, ...] = (BulkAction.RETRY, BulkAction.CANCEL)
_BULK_DONE = {BulkAction.RETRY: "Retried", BulkAction.CANCEL: "Cancelled"}
# Jobs picked one by one, at most at once (a page lists PAGE_SIZE).
PICKED_MAX = 1000


@dataclass(frozen=True)
class JobFilters:
    """The jobs page's filters as typed, and as the service takes them."""

    queue: str | None = None
    state: JobState | None = None
    type: str | None = None
    payload_text: str = ""
    payload: Any = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    after: str | None = None

    def params(self, *, after: str | None = None) -> dict[str, str]:
        """The filters as query parameters (empty ones left out), with a keyset position."""
        out: dict[str, str] = {}
        if self.queue:
            out["queue"] = self.queue
        if self.state:
            out["state"] = self.state.value
        if self.type:
            out["type"] = self.type
        if self.payload_text:
            out["payload"] = self.payload_text
        if self.created_after:
            out["created_after"] = _form_time(self.created_after)
        if self.created_before:
            out["created_before"] = _form_time(self.created_before)
        if after:
            out["after"] = after
        return out

    def query(self, *, after: str | None = None) -> str:
        """The filters as a query string (``""`` when there are none)."""
        return urlencode(self.params(after=after))

    def url(self, *, after: str | None = None, path: str = f"{PREFIX}/jobs") -> str:
        """The jobs page (or ``path``) with these filters and keyset position."""
        query = self.query(after=after)
        return f"{path}?{query}" if query else path

    @property
    def described(self) -> str:
        """The filters in words, for the bulk confirmation."""
        parts = []
        if self.queue:
            parts.append(f"queue = {self.queue}")
        if self.state:
            parts.append(f"state = {self.state.value}")
        if self.type:
            parts.append(f"type = {self.type}")
        if self.payload_text:
            parts.append(f"payload contains {self.payload_text}")
        if self.created_after:
            parts.append(f"created from {_form_time(self.created_after)} UTC")
        if self.created_before:
            parts.append(f"created before {_form_time(self.created_before)} UTC")
        return ", ".join(parts) if parts else "no filter: every queue you can see"

    def search(self, call: Call) -> JobSearch:
        """The search these filters ask for, within the visitor's key's scopes (else 403)."""
        return job_search(
            call.caller.principal,
            prefix="",
            queue=self.queue,
            status=self.state,
            type=self.type,
            payload=self.payload,
            created_after=self.created_after,
            created_before=self.created_before,
        )


def _form_time(value: datetime) -> str:
    """An instant as a datetime-local field shows it, in UTC (the dashboard's clock)."""
    return value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M")


def parse_form_time(text: str, label: str) -> tuple[datetime | None, str | None]:
    """A datetime-local field's value, read in UTC, or why it is unusable."""
    try:
        value = datetime.fromisoformat(text)
    except ValueError:
        return None, f"The {label} time is not a date and time such as 2030-01-31T09:00."
    value = value.replace(tzinfo=UTC) if value.tzinfo is None else value
    try:
        instant_in_window(value)
    except ValueError as exc:
        return None, f"The {label} time is out of range: {exc}."
    return value, None


def parse_payload_filter(text: str) -> tuple[Any, str | None]:
    """The JSON typed as a payload filter, parsed as the API parses it, or why it is unusable."""
    try:
        value = payload_filter(text, field="payload")
    except InvalidInput as exc:
        detail = exc.detail.removeprefix("payload filter: ")
        return None, (
            f'The payload filter is not usable: {detail}. Type JSON such as {{"user": 42}}.'
        )
    if not isinstance(value, dict | list):
        return None, (
            'The payload filter must be a JSON object or array, such as {"user": 42}; '
            "leave it empty to match every payload."
        )
    return value, None


def parse_filters(params: Mapping[str, str], settings: Settings) -> tuple[JobFilters, list[str]]:
    """The jobs page's filters from query or form fields, and every problem with them."""
    errors: list[str] = []
    queue = (params.get("queue") or "").strip() or None
    queue_max = settings.queue_name_max_chars
    if queue is not None and not is_queue_name(queue, queue_max):
        errors.append(
            f"A queue name is a letter or digit, then up to {queue_max - 1} letters, digits "
            "or _ . : - characters."
        )
    state_text = (params.get("state") or "").strip()
    state: JobState | None = None
    if state_text:
        try:
            state = JobState(state_text)
        except ValueError:
            errors.append(f"Unknown state {state_text!r}: choose one of {', '.join(STATES)}.")
    job_type = params.get("type") or None
    if job_type is not None and not is_job_type(job_type, settings.type_max_chars):
        errors.append(f"A job type is at most {settings.type_max_chars} characters, without NUL.")
    payload_text = (params.get("payload") or "").strip()
    payload: Any = None
    if payload_text:
        payload, problem = parse_payload_filter(payload_text)
        if problem is not None:
            errors.append(problem)
    times: dict[str, datetime | None] = {}
    for name, label in (("created_after", "from"), ("created_before", "before")):
        text = (params.get(name) or "").strip()
        times[name] = None
        if text:
            times[name], problem = parse_form_time(text, label)
            if problem is not None:
                errors.append(problem)
    after = params.get("after") or None
    if after is not None and not is_cursor(after):
        errors.append("The page position (after) is malformed; start again from the newest jobs.")
        after = None
    filters = JobFilters(
        queue=queue,
        state=state,
        type=job_type,
        payload_text=payload_text,
        payload=payload,
        created_after=times["created_after"],
        created_before=times["created_before"],
        after=after,
    )
    return filters, errors


def stored(state: JobState | None) -> JobStatus | None:
    """The stored state a filter's state lies in (retrying jobs are scheduled)."""
    if state is None:
        return None
    return JobStatus.SCHEDULED if state is JobState.RETRYING else JobStatus(state.value)


def bulk_offered(state: JobState | None) -> list[str]:
    """The bulk actions that make sense for a state filter (each takes some state of it)."""
    offered = []
    status = stored(state)
    for action in BULK_OFFERED:
        allowed, default = BULK_STATES[action]
        if (status is None and default) or (status is not None and status in allowed):
            offered.append(action.value)
    return offered


async def jobs(call: Call) -> Response:
    """Jobs newest first, filtered, with keyset paging and the bulk actions."""
    filters, errors = parse_filters(call.request.query_params, call.settings)
    context: dict[str, Any] = {
        "filters": filters,
        "errors": errors,
        "jobs": [],
        "next_cursor": None,
        "totals": None,
        "bulk": bulk_offered(filters.state),
    }
    status = 200
    if not errors:
        try:
            rows, next_cursor = await call.services.ops.search(
                filters.search(call), limit=PAGE_SIZE, after=filters.after
            )
        except (InvalidInput, Forbidden) as exc:
            errors.append(exc.detail if isinstance(exc, Forbidden) else input_problem(exc))
            status = status_of(exc)
        else:
            covers = call.caller.principal.covers
            stats = [asdict(r) for r in await call.services.ops.queue_stats() if covers(r.name)]
            context.update(
                jobs=[{**asdict(r), "retrying": r.retrying} for r in rows],
                next_cursor=next_cursor,
                totals=views.state_totals(stats, STATES, queue=filters.queue),
            )
    else:
        status = 400
    return call.page("jobs", nav="jobs", status=status, **context)


def _bulk_request(
    call: Call, fields: Mapping[str, str]
) -> tuple[BulkAction, JobFilters, JobSearch]:
    action_text = fields.get("action", "")
    if action_text not in {a.value for a in BULK_OFFERED}:
        raise call.refuse(400, "Choose retry or cancel.")
    action = BulkAction(action_text)
    filters, errors = parse_filters(fields, call.settings)
    if errors:
        raise call.refuse(400, " ".join(errors))
    if bulk_states(action, stored(filters.state)) is None:
        allowed = ", ".join(s.value for s in JobStatus if s in BULK_STATES[action][0])
        raise call.refuse(
            400,
            f"Bulk {action.value} applies to {allowed} jobs; the filter asks for "
            f"{filters.state.value if filters.state else 'none'}.",
        )
    return action, filters, filters.search(call)


async def bulk_confirm(call: Call) -> Response:
    """The confirmation of a bulk action: exactly how many jobs it would change now."""
    action, filters, search = _bulk_request(call, call.request.query_params)
    count = await call.services.ops.bulk_preview(action, search)
    touched = bulk_states(action, stored(filters.state)) or []
    return call.render(
        "bulk.html",
        nav="jobs",
        action=action.value,
        filters=filters,
        count=count,
        touched=[s.value for s in touched],
    )


async def bulk_run(call: Call) -> Response:
    """Runs a confirmed bulk action; back to the jobs page with how many jobs it changed."""
    action, filters, search = _bulk_request(call, call.form)
    principal = call.caller.principal
    outcome = await call.services.ops.bulk(
        action, search, actor=principal.name, actor_key_id=principal.key_id
    )
    noun = "job" if outcome.changed == 1 else "jobs"
    confirmed = call.form.get("confirmed", "")
    moved = ""
    if confirmed.isascii() and confirmed.isdigit() and int(confirmed) != outcome.changed:
        # The filter's jobs, counted again as the action ran: some came or went meanwhile.
        moved = f" ({int(confirmed)} when you confirmed: jobs entered or left the filter since)"
    return call.redirect(
        filters.url(), Flash("ok", f"{_BULK_DONE[action]} {outcome.changed} {noun}{moved}")
    )


def _picked_ids(texts: Iterable[str]) -> list[int] | None:
    """Job ids as sent (repeated fields, or comma-separated), each once and in order; ``None``
    when one is not a job id."""
    ids: dict[int, None] = {}
    for text in texts:
        for part in text.split(","):
            part = part.strip()
            if not part:
                continue
            if not part.isascii() or not part.isdigit() or not valid_id(int(part)):
                return None
            ids.setdefault(int(part), None)
    return list(ids)


def _picked_request(call: Call, fields: Mapping[str, str]) -> tuple[BulkAction, JobFilters]:
    """The action picked jobs are to get, and the jobs page to go back to."""
    action_text = fields.get("action", "")
    if action_text not in {a.value for a in BULK_OFFERED}:
        raise call.refuse(400, "Choose retry or cancel.")
    back, errors = parse_filters(fields, call.settings)
    return BulkAction(action_text), (JobFilters() if errors else back)


async def picked_confirm(call: Call) -> Response:
    """The confirmation of an action on jobs picked one by one: those it applies to now, by
    state, and those it leaves alone (another state, or gone)."""
    params = call.request.query_params
    action, back = _picked_request(call, params)
    ids = _picked_ids(params.getlist("id"))
    if ids is None:
        raise call.refuse(400, "The picked jobs are malformed; pick them again.")
    if not ids:
        raise call.refuse(400, "Tick the jobs to act on first.")
    if len(ids) > PICKED_MAX:
        raise call.refuse(400, f"Pick at most {PICKED_MAX} jobs at once.")
    search = job_search(call.caller.principal, prefix="", ids=ids)
    rows, _ = await call.services.ops.search(search, limit=len(ids), after=None)
    found = {r.id: r for r in rows}
    applies = bulk_states_allowed(action)
    changing = [found[i] for i in ids if i in found and found[i].status in applies]
    groups = {
        status.value: ",".join(str(r.id) for r in changing if r.status == status)
        for status in JobStatus
        if any(r.status == status for r in changing)
    }
    return call.render(
        "bulk.html",
        nav="jobs",
        action=action.value,
        picked=True,
        back=back,
        picked_count=len(ids),
        changing=[{"id": r.id, "state": "retrying" if r.retrying else r.status} for r in changing],
        left=[
            {"id": i, "state": "retrying" if found[i].retrying else found[i].status}
            for i in ids
            if i in found and found[i].status not in applies
        ],
        missing=[i for i in ids if i not in found],
        groups=groups,
        touched=[s.value for s in JobStatus if s in applies],
    )


async def picked_run(call: Call) -> Response:
    """Runs a confirmed action on exactly the confirmed jobs, each if it is still in the state it
    was confirmed in; back to the jobs page with how many changed."""
    action, back = _picked_request(call, call.form)
    applies = bulk_states_allowed(action)
    groups: dict[JobStatus, list[int]] = {}
    seen: set[int] = set()
    for status in JobStatus:
        text = call.form.get(f"ids_{status.value}", "")
        if not text:
            continue
        ids = _picked_ids([text])
        if ids is None or status not in applies:
            raise call.refuse(400, "The confirmed jobs are malformed; confirm again.")
        groups[status] = [i for i in ids if i not in seen]
        seen.update(ids)
    if not seen:
        raise call.refuse(400, "No jobs were confirmed.")
    if len(seen) > PICKED_MAX:
        raise call.refuse(400, f"Confirm at most {PICKED_MAX} jobs at once.")
    principal = call.caller.principal
    changed = 0
    for status, ids in groups.items():
        if not ids:
            continue
        outcome = await call.services.ops.bulk(
            action,
            job_search(principal, prefix="", status=status.value, ids=ids),
            actor=principal.name,
            actor_key_id=principal.key_id,
        )
        changed += outcome.changed
    noun = "job" if changed == 1 else "jobs"
    moved = len(seen) - changed
    note = f" ({moved} had changed state meanwhile, left alone)" if moved else ""
    return call.redirect(
        back.url(after=back.after), Flash("ok", f"{_BULK_DONE[action]} {changed} {noun}{note}")
    )


ROUTES = (
    Route("GET", f"{PREFIX}/jobs", jobs, READ),
    Route("GET", f"{PREFIX}/fragments/jobs", jobs, READ),
    Route("GET", f"{PREFIX}/jobs/bulk", bulk_confirm, READ_OPERATE),
    Route("POST", f"{PREFIX}/jobs/bulk", bulk_run, READ_OPERATE, action=True),
    Route("GET", f"{PREFIX}/jobs/picked", picked_confirm, READ_OPERATE),
    Route("POST", f"{PREFIX}/jobs/picked", picked_run, READ_OPERATE, action=True),
)
