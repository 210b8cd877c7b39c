"""Migrations: upgrade -> downgrade -> upgrade round trip; the models match the migrations."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import create_async_engine
from sqlalchemy.pool import NullPool

from app.db import async_url
from app.migrations import downgrade, upgrade
from app.models import metadata
from tests.conftest import create_database, drop_database


@pytest.fixture
def empty_database(pg_server_url: str) -> Iterator[str]:
    url = create_database(pg_server_url, prefix="jobq_migrations")
    yield url
    drop_database(pg_server_url, url)


async def _inspect(url: str, fn: Any) -> Any:
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(fn)
    finally:
        await engine.dispose()


def _tables(conn: Connection) -> set[str]:
    return set(inspect(conn).get_table_names())


def _functions(conn: Connection) -> set[str]:
    rows = conn.execute(text("SELECT proname FROM pg_proc WHERE proname LIKE 'jobq_%'"))
    return {r[0] for r in rows}


def _diff(conn: Connection) -> list[Any]:
    # Partitions are the storage of a partitioned table the models declare (migration 0028);
    # their own constraints and indexes live in the migration only.
    partitions = set(
        conn.execute(text("SELECT relname FROM pg_class WHERE relispartition")).scalars()
    )

    def declared(name: str | None, type_: str, parent_names: Any) -> bool:
        return not (type_ == "table" and name in partitions)

    context = MigrationContext.configure(
        conn, opts={"compare_server_default": True, "include_name": declared}
    )
    return list(compare_metadata(context, metadata))


def test_upgrade_downgrade_upgrade_round_trip(empty_database: str) -> None:
    upgrade(empty_database)
    assert {"jobs", "queues", "alembic_version"} <= asyncio.run(_inspect(empty_database, _tables))
    assert asyncio.run(_inspect(empty_database, _functions)) == {
        "jobq_backoff",
        "jobq_errors_append",
        "jobq_counts_inserted",
        "jobq_counts_updated",
        "jobq_counts_deleted",
        "jobq_counts_truncated",
        "jobq_counters_fold",
        "jobq_flow_counted_deleted",
        "jobq_flow_counted_updated",
        "jobq_flow_truncated",
        "jobq_notify_finished",
        "jobq_progress_decile",
        "jobq_mask_message",
        "jobq_failure_pattern",
        "jobq_events_deleted",
        "jobq_events_truncated",
        "jobq_linked_inserted",
        "jobq_linked_reopened",
        "jobq_linked_ready",
        "jobq_linked_settled",
        "jobq_webhook_finished",
        "jobq_webhook_secret",
    }
    downgrade(empty_database, "base")
    assert asyncio.run(_inspect(empty_database, _tables)) == {"alembic_version"}
    assert asyncio.run(_inspect(empty_database, _functions)) == set()
    upgrade(empty_database)
    assert {"jobs", "queues"} <= asyncio.run(_inspect(empty_database, _tables))


def test_models_match_migrations(empty_database: str) -> None:
    upgrade(empty_database)
    assert asyncio.run(_inspect(empty_database, _diff)) == []


async def _run_sql(url: str, *statements: str) -> list[Any]:
    engine = create_async_engine(async_url(url), poolclass=NullPool)
    try:
        async with engine.begin() as conn:
            results = [await conn.execute(text(s)) for s in statements]
            return [r.all() if r.returns_rows else None for r in results]
    finally:
        await engine.dispose()


def test_0006_moves_waiting_jobs_clamps_unreadable_times_and_counts_the_history(
    empty_database: str,
) -> None:
    upgrade(empty_database, "0005")
    columns = "(queue, type, status, max_attempts, lease_seconds, run_at)"
    asyncio.run(
        _run_sql(
            empty_database,
            f"INSERT INTO jobs {columns} VALUES "
            "('q', 'due', 'pending', 1, 30, now() - interval '1 minute'), "
            "('q', 'later', 'pending', 1, 30, now() + interval '1 day'), "
            "('q', 'done', 'succeeded', 1, 30, now()), "
            "('r', 'bc', 'pending', 1, 30, '0001-01-01 00:00:00+05'), "
            "('r', 'far', 'pending', 1, 30, '9999-12-31 23:59:59-05')",
        )
    )
    upgrade(empty_database)
    [rows, counts] = asyncio.run(
        _run_sql(
            empty_database,
            "SELECT type, status, run_at::text FROM jobs ORDER BY id",
            "SELECT queue, status, sum(jobs)::int FROM queue_counts GROUP BY 1, 2 ORDER BY 1, 2",
        )
    )
    by_type = {t: (s, r) for t, s, r in rows}
    assert by_type["due"][0] == "pending" and by_type["later"][0] == "scheduled"
    assert by_type["bc"] == ("pending", "1970-01-01 00:00:00+00")
    assert by_type["far"] == ("scheduled", "8999-12-31 23:59:59+00")
    assert counts == [
        ("q", "pending", 1),
        ("q", "scheduled", 1),
        ("q", "succeeded", 1),
        ("r", "pending", 1),
        ("r", "scheduled", 1),
    ]


def test_0014_moves_the_slots_of_running_jobs_to_rows_per_queue(empty_database: str) -> None:
    upgrade(empty_database, "0013")
    columns = (
        "(queue, type, status, max_attempts, lease_seconds, run_at, concurrency_key, flow_keys)"
    )
    asyncio.run(
        _run_sql(
            empty_database,
            f"INSERT INTO jobs {columns} VALUES "
            "('a', 't', 'running', 1, 30, now(), 'c', ARRAY['key:c', 'queue:a']), "
            "('b', 't', 'running', 1, 30, now(), 'c', ARRAY['key:c']), "
            "('b', 't', 'pending', 1, 30, now(), 'c', NULL)",
            "INSERT INTO flow_state (key, running) VALUES ('key:c', 2), ('queue:a', 1)",
        )
    )

    def state() -> tuple[list[Any], list[Any]]:
        [rows, keys] = asyncio.run(
            _run_sql(
                empty_database,
                "SELECT key, running FROM flow_state WHERE running > 0 ORDER BY key",
                "SELECT flow_keys FROM jobs ORDER BY id",
            )
        )
        return rows, [k for (k,) in keys]

    upgrade(empty_database)
    assert state() == (
        [("key:a|c", 1), ("key:b|c", 1), ("queue:a", 1)],
        [["key:a|c", "queue:a"], ["key:b|c"], None],
    )
    downgrade(empty_database, "0013")
    assert state() == ([("key:c", 2), ("queue:a", 1)], [["key:c", "queue:a"], ["key:c"], None])


def test_0015_adds_the_run_marks_and_schedule_errors_and_parks_nothing_on_upgrade(
    empty_database: str,
) -> None:
    upgrade(empty_database, "0014")
    asyncio.run(
        _run_sql(
            empty_database,
            "INSERT INTO schedules (name, interval_seconds, queue, type, next_run_at) "
            "VALUES ('tick', 60, 'q', 't', now())",
            "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, run_at, "
            "idempotency_key) VALUES ('q', 't', 'pending', 1, 30, now(), 'schedule:tick:x')",
        )
    )
    upgrade(empty_database)
    [schedules, marks] = asyncio.run(
        _run_sql(
            empty_database,
            "SELECT name, last_error, errored_at FROM schedules",
            "SELECT idempotency_key, schedule_name, scheduled_for FROM jobs",
        )
    )
    # Existing schedules start without error; old runs keep their keys and get no mark.
    assert schedules == [("tick", None, None)]
    assert marks == [("schedule:tick:x", None, None)]
    # One job per mark.
    mark = (
        "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, run_at, "
        "schedule_name, scheduled_for) VALUES ('q', 't', 'pending', 1, 30, "
        "'2026-12-02 00:00:00+00', 'tick', '2026-12-02 00:00:00+00')"
    )
    asyncio.run(_run_sql(empty_database, mark))
    with pytest.raises(IntegrityError):
        asyncio.run(_run_sql(empty_database, mark))
    downgrade(empty_database, "0014")
    [columns] = asyncio.run(
        _run_sql(
            empty_database,
            "SELECT table_name, column_name FROM information_schema.columns "
            "WHERE (table_name, column_name) IN (('jobs', 'schedule_name'), "
            "('jobs', 'scheduled_for'), ('schedules', 'last_error'), ('schedules', 'errored_at'))",
        )
    )
    assert columns == []


def test_0017_adds_the_history_and_deletes_it_with_its_jobs(empty_database: str) -> None:
    upgrade(empty_database, "0016")
    asyncio.run(
        _run_sql(
            empty_database,
            "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds, run_at) "
            "VALUES ('q', 't', 'pending', 1, 30, now()), ('q', 't', 'pending', 1, 30, now())",
        )
    )
    upgrade(empty_database)
    results = asyncio.run(
        _run_sql(
            empty_database,
            "INSERT INTO job_events (job_id, kind) VALUES (1, 'promoted'), (2, 'promoted')",
            "DELETE FROM jobs WHERE id = 1",
            "SELECT jobq_mask_message('id 42 at ''x'' in \"y\" 0xff12 "
            "1b4e28ba-2fa1-11d2-883f-0016d3cca427 v2 abcdef0123')",
            'SELECT jobq_progress_decile(p) FROM (VALUES (\'{"done": 5, "total": 20}\'::jsonb), '
            '(\'{"done": 25, "total": 20}\'), (\'{"done": 1, "total": 0}\'), (\'"x"\'), '
            '(\'{"done": "1", "total": 2}\')) AS v(p)',
        )
    )
    masked, deciles = results[2], results[3]
    assert masked == [("id <n> at '?' in \"?\" <hex> <uuid> v2 <hex>",)]
    assert [d for (d,) in deciles] == [2, 10, None, None, None]
    [left] = asyncio.run(_run_sql(empty_database, "SELECT job_id FROM job_events"))
    assert left == [(2,)]
    asyncio.run(_run_sql(empty_database, "TRUNCATE jobs"))
    [left] = asyncio.run(_run_sql(empty_database, "SELECT job_id FROM job_events"))
    assert left == []
    downgrade(empty_database, "0016")
    assert "job_events" not in asyncio.run(_inspect(empty_database, _tables))


_COUNTS = (
    "SELECT queue, status, sum(jobs)::int FROM queue_counts GROUP BY 1, 2 "
    "HAVING sum(jobs) <> 0 ORDER BY 1, 2"
)
_OUTCOMES = (
    "SELECT queue, minute::text, outcome, sum(jobs)::int FROM queue_throughput "
    "GROUP BY 1, 2, 3 ORDER BY 1, 2, 3"
)


def test_0028_moves_the_journals_into_slots_and_back_with_the_same_sums(
    empty_database: str,
) -> None:
    upgrade(empty_database, "0027")
    asyncio.run(
        _run_sql(
            empty_database,
            "INSERT INTO jobs (queue, type, status, max_attempts, lease_seconds) "
            "SELECT 'q' || (i % 3), 't', 'pending', 1, 30 FROM generate_series(1, 30) i",
            "UPDATE jobs SET status = 'running' WHERE id % 10 = 1",
            "UPDATE jobs SET status = 'running' WHERE id % 10 = 6",
            "UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE id % 5 = 2",
            "UPDATE jobs SET status = 'dead', finished_at = now() WHERE id % 5 = 3",
            "DELETE FROM jobs WHERE id = 30",
            # Folded sums as 0027's fold leaves them, beside journal rows not folded yet.
            "WITH folded AS (DELETE FROM queue_counts WHERE status = 'pending' "
            "RETURNING queue, status, jobs) INSERT INTO queue_counts (queue, status, jobs) "
            "SELECT queue, status, sum(jobs) FROM folded GROUP BY 1, 2",
            "INSERT INTO queue_throughput (queue, minute, outcome, jobs) "
            "VALUES ('q0', '2026-12-07 10:00+00', 'failed', 4)",
        )
    )
    counts, outcomes, journal = asyncio.run(
        _run_sql(empty_database, _COUNTS, _OUTCOMES, "SELECT count(*) FROM queue_counts")
    )
    assert sum(n for _, _, n in counts) == 29 and len(outcomes) >= 4
    assert journal[0][0] > len(counts)  # several rows per (queue, state) to move

    upgrade(empty_database, "0028")
    after, after_outcomes, in_slots = asyncio.run(
        _run_sql(
            empty_database,
            _COUNTS,
            _OUTCOMES,
            "SELECT (SELECT count(*) FROM queue_counts_slot1) + "
            "(SELECT count(*) FROM queue_counts_slot2), (SELECT count(*) FROM queue_counts_totals)",
        )
    )
    assert (after, after_outcomes) == (counts, outcomes)
    assert in_slots == [(0, len(counts))]  # moved as their sums, one row per (queue, state)
    # The new triggers append to the current slot; the counts stay exact.
    [_, appended, exact, actual] = asyncio.run(
        _run_sql(
            empty_database,
            "UPDATE jobs SET status = 'succeeded', finished_at = now() WHERE status = 'running'",
            "SELECT count(*) FROM queue_counts_slot1",
            _COUNTS,
            "SELECT queue, status, count(*)::int FROM jobs GROUP BY 1, 2 ORDER BY 1, 2",
        )
    )
    assert appended[0][0] > 0 and exact == actual

    downgrade(empty_database, "0027")
    back, back_outcomes = asyncio.run(_run_sql(empty_database, _COUNTS, _OUTCOMES))
    assert back == actual
    assert sum(n for *_, n in back_outcomes) == sum(n for *_, n in outcomes) + 6
    assert "counter_journal_slot" not in asyncio.run(_inspect(empty_database, _tables))
    # 0027's triggers write rows without a slot again.
    [_, exact] = asyncio.run(
        _run_sql(
            empty_database, "UPDATE jobs SET status = 'pending' WHERE status = 'dead'", _COUNTS
        )
    )
    [actual] = asyncio.run(
        _run_sql(
            empty_database,
            "SELECT queue, status, count(*)::int FROM jobs GROUP BY 1, 2 ORDER BY 1, 2",
        )
    )
    assert exact == actual
