"""The statements built with SQLAlchemy Core: job listing, search, count, bulk batches, audit list.

Their shape depends on the filters given, so they are built per call rather than written as
named SQL; each still counts as one statement of its store (``BUILT`` names them, and the
mapping test checks them as it checks the named SQL).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Integer,
    Select,
    Text,
    and_,
    any_,
    case,
    cast,
    delete,
    exists,
    func,
    insert,
    literal,
    select,
    true,
    union_all,
    update,
)
from sqlalchemy.dialects.postgresql import ARRAY, JSONB

from app.domain.states import RETRY_LEASE_ENDS, BulkAction, JobStatus
from app.domain.types import AuditFilter, JobSearch, ListFilter
from app.models import audit_log, job_events, jobs, queue_counts
from app.store.conn import to_json

# The statements built here, by the SQL file (store) whose class runs them.
BUILT: Mapping[str, frozenset[str]] = {
    "jobs": frozenset({"job_list", "job_count", "job_bulk_batch", "job_id_ceiling"}),
    "audit": frozenset({"audit_list"}),
}


def _search_conditions(search: JobSearch) -> list[ColumnElement[bool]]:
    """The search's filters on ``jobs`` other than queue and state."""
    conditions: list[ColumnElement[bool]] = []
    if search.type is not None:
        conditions.append(jobs.c.type == search.type)
    if search.payload is not None:
        # jsonb @>, served by ix_jobs_payload (jsonb_path_ops).
        conditions.append(
            jobs.c.payload.op("@>")(cast(literal(to_json(search.payload), Text), JSONB))
        )
    if search.created_after is not None:
        conditions.append(jobs.c.created_at >= search.created_after)
    if search.created_before is not None:
        conditions.append(jobs.c.created_at < search.created_before)
    if search.retrying is not None:
        retrying = and_(
            jobs.c.status == JobStatus.SCHEDULED.value,
            jobs.c.lease_ended_by.in_(sorted(RETRY_LEASE_ENDS)),
        )
        conditions.append(retrying if search.retrying else ~retrying)
    if search.ids is not None:
        conditions.append(jobs.c.id == any_(literal(list(search.ids), ARRAY(BigInteger))))
    if search.error is not None:
        pattern = search.error.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
        conditions.append(jobs.c.last_error.ilike(f"%{pattern}%"))
    return conditions


def _in_queues(column: Any, search: JobSearch) -> list[ColumnElement[bool]]:
    """The search's queue, and a scoped key's LIKE patterns, as conditions on ``column``."""
    conditions: list[ColumnElement[bool]] = []
    if search.queue is not None:
        conditions.append(column == search.queue)
    if search.queue_patterns is not None:
        conditions.append(column.like(any_(literal(list(search.queue_patterns), ARRAY(Text)))))
    return conditions


def job_list_query(where: ListFilter) -> Select[Any]:
    """The listing as one statement whose cost follows the page, not the table.

    Newest first, by id. Unfiltered, it walks the primary key. Filtered by queue, state or type,
    it walks one index range per (queue, state) pair (``ix_jobs_queue_status_id``, or with a
    type ``ix_jobs_queue_type_status_id``), each ordered by id and cut at the page size, and
    merges them: at most ``limit`` rows per pair are read. Without a queue the pairs cover every
    queue the counters know; without a state, every state (or ``where.statuses``).

    A payload or time search is one plain statement, left to the planner: the GIN index on
    payload or the BRIN index on created_at for a rare match (then a sort of the matches), or
    the primary key walked newest first, filtered, for a common one.
    """
    search = where.search
    if where.statuses is not None:
        states = [s.value for s in where.statuses]
    elif search.status is not None:
        states = [search.status.value]
    else:
        states = [s.value for s in JobStatus]
    if search.searches_content:
        conditions = _search_conditions(search) + _in_queues(jobs.c.queue, search)
        if len(states) < len(JobStatus):
            conditions.append(jobs.c.status.in_(states))
        if where.before_id is not None:
            conditions.append(jobs.c.id < where.before_id)
        return select(jobs).where(*conditions).order_by(jobs.c.id.desc()).limit(where.limit)

    if (
        search.queue is None
        and len(states) == len(JobStatus)
        and search.type is None
        and search.queue_patterns is None
    ):
        query = select(jobs)
        if where.before_id is not None:
            query = query.where(jobs.c.id < where.before_id)
        return query.order_by(jobs.c.id.desc()).limit(where.limit)

    # The (queue, state) pairs that hold jobs, from the counters: an empty pair gets no branch
    # (a branch over an empty pair is where a primary-key walk would read the whole history).
    pairs = select(queue_counts.c.queue.label("name"), queue_counts.c.status).where(
        queue_counts.c.status.in_(states), *_in_queues(queue_counts.c.queue, search)
    )
    pair_list = (
        pairs.group_by(queue_counts.c.queue, queue_counts.c.status)
        .having(func.sum(queue_counts.c.jobs) > 0)
        .subquery("qn")
    )
    # The state as a range of one value, and the branch ordered by (state, id): only the
    # composite index yields that order, so the planner cannot walk the primary key newest first
    # and filter (with an equality it may, as the order then reduces to id alone), which reads
    # the whole history before it finds a rare pair's rows.
    conditions = [
        jobs.c.queue == pair_list.c.name,
        jobs.c.status >= pair_list.c.status,
        jobs.c.status <= pair_list.c.status,
    ]
    conditions.extend(_search_conditions(search))
    if where.before_id is not None:
        conditions.append(jobs.c.id < where.before_id)
    # The branches read ids only, which the composite index holds (an index-only scan), and the
    # page's rows are then fetched by primary key. Reading whole rows, a branch could as well walk
    # the primary key newest first and filter, which the planner may prefer for a pair it thinks
    # common, and which reads the whole history for a pair that is rare.
    branch = (
        select(jobs.c.id)
        .where(*conditions)
        .order_by(jobs.c.status.desc(), jobs.c.id.desc())
        .limit(where.limit)
        .lateral("j")
    )
    page = (
        select(branch.c.id)
        .select_from(pair_list.join(branch, true()))
        .order_by(branch.c.id.desc())
        .limit(where.limit)
    )
    return (
        select(jobs)
        .where(jobs.c.id == any_(func.array(page.scalar_subquery())))
        .order_by(jobs.c.id.desc())
    )


def job_id_ceiling_query() -> Select[Any]:
    """One past the highest job id now (the primary key's last entry), NULL when empty."""
    return select((func.max(jobs.c.id) + 1).label("ceiling"))


def job_count_query(search: JobSearch, statuses: Sequence[JobStatus]) -> Select[Any]:
    """How many jobs of ``statuses`` a search covers now: from the counters when it names no
    type, payload or time, else counted through the indexes the listing uses."""
    states = [s.value for s in statuses]
    if search.type is None and search.retrying is None and not search.searches_content:
        return select(func.coalesce(func.sum(queue_counts.c.jobs), 0)).where(
            queue_counts.c.status.in_(states), *_in_queues(queue_counts.c.queue, search)
        )
    return (
        select(func.count())
        .select_from(jobs)
        .where(
            jobs.c.status.in_(states),
            *_search_conditions(search),
            *_in_queues(jobs.c.queue, search),
        )
    )


# What each bulk action does to a locked row (the single ops actions' SET lists, job_cancel and
# job_retry in sql/jobs.sql; cancel here never meets a running job).
_BULK_SET: Mapping[BulkAction, Mapping[str, Any]] = {
    BulkAction.RETRY: {
        "status": "pending",
        "attempts": 0,
        "run_at": func.now(),
        "lease_id": None,
        "worker_id": None,
        "lease_key_id": None,
        "lease_instance": None,
        "lease_ended_by": None,
        "lease_expires_at": None,
        "started_at": None,
        "finished_at": None,
        "result": None,
        "updated_at": func.now(),
    },
    BulkAction.CANCEL: {
        "status": "cancelled",
        "finished_at": func.now(),
        "lease_expires_at": None,
        "updated_at": func.now(),
    },
}


def job_bulk_batch_query(
    action: BulkAction,
    search: JobSearch,
    statuses: Sequence[JobStatus],
    *,
    below_id: int | None,
    batch_size: int,
    actor: str,
    actor_key_id: int | None,
) -> Select[Any]:
    """One batch of a bulk action as one statement: the newest ``batch_size`` jobs of the search
    below ``below_id``, found as the listing finds a page, then locked, checked again and
    changed, each change recorded in the job's history with ``actor``. Answers every candidate
    with whether this statement changed it; the next batch
    starts below the lowest candidate, so no batch walks over the jobs an earlier one changed
    or deleted."""
    states = [s.value for s in statuses]
    page = job_list_query(
        ListFilter(search=search, statuses=tuple(statuses), before_id=below_id, limit=batch_size)
    ).subquery("page")
    candidates = select(page.c.id, page.c.queue).cte("candidates").prefix_with("MATERIALIZED")
    # The candidates are locked by primary key alone (an unnested array, a probe per id), and the
    # change re-checks the state on the locked, newest version of each row, so a job another
    # transaction moved meanwhile is left alone. The states come from a sub-select, not a
    # constant list: with a constant list, a partial index of finished jobs qualifies, and with
    # statistics from before a large bulk action the planner walked it whole for every batch
    # (measured: 9 s a batch, against 0.02 s).
    ids = (
        func.unnest(func.array(select(candidates.c.id).scalar_subquery()))
        .table_valued("id")
        .render_derived(name="c")
    )
    # The locked rows as they are before the change: what the history records of them.
    locked = (
        select(*[jobs.c[name] for name in _BEFORE_CHANGE])
        .select_from(ids.join(jobs, jobs.c.id == ids.c.id))
        .with_for_update(of=jobs)
        .cte("locked")
    )
    wanted = func.array(select(func.unnest(literal(states, ARRAY(Text)))).scalar_subquery())
    chosen = and_(
        jobs.c.id == any_(func.array(select(locked.c.id).scalar_subquery())),
        jobs.c.status == any_(wanted),
    )
    values = dict(_BULK_SET.get(action, {}))
    if action is BulkAction.RETRY:
        values["status"] = _retried_status(locked)
    if action is BulkAction.DELETE:
        change: Any = delete(jobs).where(chosen).returning(jobs.c.id).cte("changed")
        recorded = None
    else:
        change = (
            update(jobs)
            .where(chosen, jobs.c.id == locked.c.id)
            .values(values)
            .returning(jobs.c.id, *[locked.c[name].label(f"was_{name}") for name in _BEFORE_CHANGE])
            .cte("changed")
        )
        recorded = _bulk_events(action, change, actor=actor, actor_key_id=actor_key_id)
    query = (
        select(
            candidates.c.id,
            candidates.c.queue,
            change.c.id.is_not(None).label("changed"),
        )
        .select_from(candidates.outerjoin(change, change.c.id == candidates.c.id))
        .order_by(candidates.c.id.desc())
    )
    if recorded is not None:
        query = query.add_cte(recorded)
    return query


def _retried_status(locked: Any) -> Any:
    """A retried job's new state: waiting while one of its parents is open, pending otherwise.

    The parents of the batch's jobs are locked first (in id order), as ``job_retry`` does: a
    parent finishing at that moment is waited for and read as it ended, or finishes after this
    commits and its trigger finds the job waiting.
    """
    parent = jobs.alias("parent")
    wanted = select(func.unnest(locked.c.depends_on)).where(locked.c.depends_on.is_not(None))
    parents = (
        select(parent.c.id, parent.c.status)
        .where(parent.c.id.in_(wanted))
        .order_by(parent.c.id)
        .with_for_update(key_share=True, of=parent)
        .cte("parents")
    )
    parents_open = exists().where(
        parents.c.id == any_(jobs.c.depends_on),
        parents.c.status.in_(("waiting", "scheduled", "pending", "running")),
    )
    return case((parents_open, literal("waiting")), else_=literal("pending"))


_BEFORE_CHANGE = (
    "id",
    "status",
    "depends_on",
    "started_at",
    "finished_at",
    "attempts",
    "worker_id",
    "lease_key_id",
    "lease_instance",
)


def _bulk_events(action: BulkAction, change: Any, *, actor: str, actor_key_id: int | None) -> Any:
    """The job_events rows of a bulk batch, as a CTE: the operator's action on each changed job,
    and for a retry first what the job's columns told of its last run (the claim and the
    completion not recorded yet), as ``job_retry`` writes them (sql/jobs.sql)."""
    columns = ["job_id", "at", "kind", "attempt", "actor", "actor_key_id", "instance", "data"]
    c = change.c
    kind = "retried" if action is BulkAction.RETRY else "cancelled"
    operator = select(
        c.id,
        func.now(),
        literal(kind),
        literal(None, Integer),
        literal(actor),
        literal(actor_key_id, BigInteger),
        literal(None, Text),
        func.jsonb_build_object("status_before", c.was_status, "bulk", True),
    )
    if action is not BulkAction.RETRY:
        rows: Any = operator
    else:
        stored = job_events.alias("s")

        def not_recorded(event: str, at: Any) -> Any:
            return ~exists().where(
                stored.c.job_id == c.id, stored.c.kind == event, stored.c.at == at
            )

        def last_run(event: str, at: Any, *conditions: Any) -> Any:
            return select(
                c.id,
                at,
                literal(event),
                c.was_attempts,
                c.was_worker_id,
                c.was_lease_key_id,
                c.was_lease_instance,
                literal(None, JSONB),
            ).where(at.is_not(None), not_recorded(event, at), *conditions)

        rows = union_all(
            last_run("claimed", c.was_started_at),
            last_run("completed", c.was_finished_at, c.was_status == "succeeded"),
            operator,
        )
    return insert(job_events).from_select(columns, rows).cte("recorded")


def audit_list_query(where: AuditFilter) -> Select[Any]:
    """The audit listing, newest first by id: the primary key, or ``(action, id)`` / ``(actor, id)``.

    A scoped view keeps only entries that name a matching queue, so it never shows key operations.
    """
    query = select(audit_log)
    if where.action is not None:
        query = query.where(audit_log.c.action == where.action)
    if where.actor is not None:
        query = query.where(audit_log.c.actor == where.actor)
    if where.queue_patterns is not None:
        query = query.where(
            audit_log.c.queue.like(any_(literal(list(where.queue_patterns), ARRAY(Text))))
        )
    if where.before_id is not None:
        query = query.where(audit_log.c.id < where.before_id)
    return query.order_by(audit_log.c.id.desc()).limit(where.limit)
