"""The counter journals rotate between slots emptied by TRUNCATE: no dead tuple per job

Revision ID: 0028
Revises: 0027
Create Date: 2026-12-07

Measured with ``python -m bench.deadrows`` (docs/storage-dead-rows.md, issue 41): the fold of
migration 0022 deleted every row the triggers appended to ``queue_counts`` and
``queue_throughput``, so each became a dead tuple, 3.0 to 5.4 a job, most of jobq's, and none
of them reclaimable under a held vacuum horizon.

Now both tables are LIST-partitioned by ``slot``: slot 0 holds the folded sums (one row per
(queue, state) and per (queue, minute, outcome), unique there), slots 1 and 2 are the journal.
The triggers append to the slot that ``counter_journal_slot`` names (a read of one row, no
write per job). A fold (app/queue/upkeep.py) first turns the journal over to the other slot and
commits that, then runs ``jobq_counters_fold()``: it takes the slot no longer current in ACCESS
EXCLUSIVE mode (which waits, within a short lock_timeout, for the transactions that appended to
it before the turn; on timeout it answers NULL and the next pass tries again), adds the slot's
sums into slot 0, and empties the slot with TRUNCATE, all in one transaction. Every row of the
slot is summed and truncated under that one lock, so none is lost or counted twice, and a
reader sees either the rows or their sums. A statement that read the old slot number before
the turn and appends after the TRUNCATE lands in that slot and is folded the next time.

Readers keep reading ``queue_counts`` and ``queue_throughput`` (all partitions). The previous
release's fold (``DELETE ... RETURNING`` from the whole table, then an INSERT of the sums that
names no slot) keeps working: ``slot`` defaults to 0, so its sums land in slot 0, and its ctid
batch walks slot 0 first, so it deletes the sum row of every key it re-inserts. Its DELETE and
this fold's lock exclude each other, so no row is folded twice. Its throughput prune deletes
old rows from every slot, as it did.

``TRUNCATE jobs`` now empties the counters with TRUNCATE as well (it deleted their rows).

Upgrade and downgrade move the rows over in the same transaction: the counts and outcomes read
the same before and after.
"""

from collections.abc import Callable, Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

PINNED = "SET search_path = pg_catalog, pg_temp"
DEFINER = "jobq_definer"
_FINISHED = "('succeeded', 'dead', 'cancelled')"

# Written with __S__ for jobq's schema (where the migration runs), quoted once at upgrade, as
# migration 0025 does. The slot is read once per statement, in an InitPlan.
_SLOT = "(SELECT s.slot FROM __S__.counter_journal_slot s)"

_COUNTS = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_counts_inserted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, slot, jobs)
    SELECT queue, status, {_SLOT}, count(*) FROM jobq_new GROUP BY queue, status;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_updated() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop = off
{PINNED} AS $$
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT o.queue AS old_queue, o.status AS old_status, n.queue, n.status,
               n.lease_ended_by
        FROM jobq_old o JOIN jobq_new n ON n.id = o.id
        WHERE n.status <> o.status OR n.queue <> o.queue
    ),
    outcomes AS (
        INSERT INTO __S__.queue_throughput (queue, minute, outcome, slot, jobs)
        SELECT queue, date_trunc('minute', now()),
               CASE WHEN status IN {_FINISHED} THEN status ELSE 'failed' END,
               {_SLOT}, count(*)
        FROM moved
        WHERE status <> old_status
          AND (status IN {_FINISHED}
               OR (old_status = 'running' AND lease_ended_by IN ('fail', 'expire', 'timeout')))
        GROUP BY 1, 2, 3
    )
    INSERT INTO __S__.queue_counts (queue, status, slot, jobs)
    SELECT old_queue, old_status, {_SLOT}, -count(*) FROM moved GROUP BY 1, 2
    UNION ALL
    SELECT queue, status, {_SLOT}, count(*) FROM moved GROUP BY 1, 2;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_deleted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, slot, jobs)
    SELECT queue, status, {_SLOT}, -count(*) FROM jobq_old GROUP BY queue, status;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_truncated() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    -- Whoever may empty jobs empties its counters the same way, leaving no dead rows.
    TRUNCATE __S__.queue_counts, __S__.queue_throughput;
    RETURN NULL;
END $$;
"""

# Folds the journal slot that is not current into slot 0 and empties it. Static statements per
# slot: a partition's name cannot be a parameter, and two slots need no dynamic SQL.
_FOLD = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_counters_fold(lock_timeout_ms integer)
RETURNS bigint LANGUAGE plpgsql
{PINNED} AS $$
DECLARE
    folding smallint;
    counted bigint;
    outcomes bigint;
BEGIN
    SELECT 3 - s.slot INTO folding FROM __S__.counter_journal_slot s;
    PERFORM set_config('lock_timeout', lock_timeout_ms || 'ms', true);
    BEGIN
        -- Waits for the transactions that appended to the slot before it was turned away from.
        IF folding = 1 THEN
            LOCK TABLE __S__.queue_counts_slot1, __S__.queue_throughput_slot1
                IN ACCESS EXCLUSIVE MODE;
        ELSE
            LOCK TABLE __S__.queue_counts_slot2, __S__.queue_throughput_slot2
                IN ACCESS EXCLUSIVE MODE;
        END IF;
    EXCEPTION WHEN lock_not_available THEN
        RETURN NULL;
    END;
    PERFORM set_config('lock_timeout', '0', true);

    SELECT count(*) INTO counted FROM __S__.queue_counts WHERE slot = folding;
    SELECT count(*) INTO outcomes FROM __S__.queue_throughput WHERE slot = folding;
    IF counted > 0 THEN
        INSERT INTO __S__.queue_counts_totals AS t (queue, status, slot, jobs)
        SELECT queue, status, 0, sum(jobs) FROM __S__.queue_counts WHERE slot = folding
        GROUP BY queue, status HAVING sum(jobs) <> 0
        ORDER BY queue, status
        ON CONFLICT (queue, status) DO UPDATE SET jobs = t.jobs + EXCLUDED.jobs;
        -- A (queue, state) that no job holds any more leaves no row behind, as before.
        DELETE FROM __S__.queue_counts_totals t
        WHERE t.jobs = 0
          AND (t.queue, t.status) IN (SELECT queue, status FROM __S__.queue_counts
                                      WHERE slot = folding);
    END IF;
    IF outcomes > 0 THEN
        INSERT INTO __S__.queue_throughput_totals AS t (queue, minute, outcome, slot, jobs)
        SELECT queue, minute, outcome, 0, sum(jobs) FROM __S__.queue_throughput
        WHERE slot = folding
        GROUP BY queue, minute, outcome
        ORDER BY queue, minute, outcome
        ON CONFLICT (queue, minute, outcome) DO UPDATE SET jobs = t.jobs + EXCLUDED.jobs;
    END IF;
    -- A TRUNCATE gives each partition (and its TOAST table and index) a new file, which
    -- rewrites their pg_class rows: not for an empty slot, so an idle queue writes nothing.
    IF counted = 0 AND outcomes = 0 THEN
        RETURN 0;
    ELSIF folding = 1 THEN
        TRUNCATE __S__.queue_counts_slot1, __S__.queue_throughput_slot1;
    ELSE
        TRUNCATE __S__.queue_counts_slot2, __S__.queue_throughput_slot2;
    END IF;
    RETURN GREATEST(counted, outcomes);
END $$;
"""

# As migration 0025 left them (a migration keeps its own copy).
_COUNTS_BEFORE = f"""
CREATE OR REPLACE FUNCTION __S__.jobq_counts_inserted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, jobs)
    SELECT queue, status, count(*) FROM jobq_new GROUP BY queue, status;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_updated() RETURNS trigger LANGUAGE plpgsql
SET enable_nestloop = off
{PINNED} AS $$
BEGIN
    WITH moved AS MATERIALIZED (
        SELECT o.queue AS old_queue, o.status AS old_status, n.queue, n.status,
               n.lease_ended_by
        FROM jobq_old o JOIN jobq_new n ON n.id = o.id
        WHERE n.status <> o.status OR n.queue <> o.queue
    ),
    outcomes AS (
        INSERT INTO __S__.queue_throughput (queue, minute, outcome, jobs)
        SELECT queue, date_trunc('minute', now()),
               CASE WHEN status IN {_FINISHED} THEN status ELSE 'failed' END,
               count(*)
        FROM moved
        WHERE status <> old_status
          AND (status IN {_FINISHED}
               OR (old_status = 'running' AND lease_ended_by IN ('fail', 'expire', 'timeout')))
        GROUP BY 1, 2, 3
    )
    INSERT INTO __S__.queue_counts (queue, status, jobs)
    SELECT old_queue, old_status, -count(*) FROM moved GROUP BY 1, 2
    UNION ALL
    SELECT queue, status, count(*) FROM moved GROUP BY 1, 2;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_deleted() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    INSERT INTO __S__.queue_counts (queue, status, jobs)
    SELECT queue, status, -count(*) FROM jobq_old GROUP BY queue, status;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION __S__.jobq_counts_truncated() RETURNS trigger LANGUAGE plpgsql
{PINNED} AS $$
BEGIN
    DELETE FROM __S__.queue_counts;
    DELETE FROM __S__.queue_throughput;
    RETURN NULL;
END $$;
"""

# Grants on the tables replaced here carry over to the new tables and their partitions (the
# fold locks and truncates a partition, which checks the partition's own rights).
_COPY_GRANTS = """
DO $do$
DECLARE
    g record;
BEGIN
    FOR g IN
        SELECT a.privilege_type, a.grantee
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) a
        WHERE c.oid = '__S__.__OLD__'::regclass AND a.grantee <> c.relowner
    LOOP
        EXECUTE format('GRANT %s ON __S__.__NEW__ TO %s', g.privilege_type,
                       CASE WHEN g.grantee = 0 THEN 'PUBLIC' ELSE quote_ident(g.grantee::regrole::text) END);
    END LOOP;
END
$do$
"""

_DEFINER_RIGHTS = f"""
DO $do$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{DEFINER}')
       AND pg_has_role(current_user, '{DEFINER}', 'USAGE') THEN
        GRANT SELECT ON __S__.counter_journal_slot TO {DEFINER};
    END IF;
END
$do$
"""

_COUNTS_COLUMNS = "queue text NOT NULL, status text NOT NULL, shard smallint NOT NULL DEFAULT 0"
_THROUGHPUT_COLUMNS = (
    "queue text NOT NULL, minute timestamptz NOT NULL, outcome text NOT NULL, "
    "shard smallint NOT NULL DEFAULT 0"
)
_SLOTS = {"totals": 0, "slot1": 1, "slot2": 2}


def _schema() -> str:
    name = op.get_bind().execute(sa.text("SELECT current_schema()")).scalar_one()
    return '"' + name.replace('"', '""') + '"'


def _runner(schema: str) -> Callable[[str], None]:
    def run(sql: str) -> None:
        # A prepared statement holds one command: a block of functions runs one at a time.
        head = "CREATE OR REPLACE FUNCTION"
        text = sql.replace("__S__", schema).strip()
        parts = text.split("\n" + head) if text.startswith(head) else [text]
        for index, part in enumerate(parts):
            op.execute((part if index == 0 else head + part).strip().rstrip(";"))

    return run


def _copy_grants(run: Callable[[str], None], old: str, new: str) -> None:
    run(_COPY_GRANTS.replace("__OLD__", old).replace("__NEW__", new))


def upgrade() -> None:
    run = _runner(_schema())
    run("ALTER TABLE __S__.queue_counts RENAME TO queue_counts_0027")
    run("ALTER TABLE __S__.queue_throughput RENAME TO queue_throughput_0027")
    run("ALTER INDEX __S__.ix_queue_throughput_minute RENAME TO ix_queue_throughput_0027_minute")

    run(
        "CREATE TABLE __S__.counter_journal_slot ("
        " id smallint NOT NULL DEFAULT 1, slot smallint NOT NULL DEFAULT 1,"
        " CONSTRAINT pk_counter_journal_slot PRIMARY KEY (id),"
        " CONSTRAINT ck_counter_journal_slot_one CHECK (id = 1),"
        " CONSTRAINT ck_counter_journal_slot_slot CHECK (slot IN (1, 2)))"
    )
    run("INSERT INTO __S__.counter_journal_slot (id, slot) VALUES (1, 1)")

    # slot defaults to 0: the previous release's fold inserts its sums without naming a slot.
    run(
        f"CREATE TABLE __S__.queue_counts ({_COUNTS_COLUMNS}, jobs bigint NOT NULL,"
        " slot smallint NOT NULL DEFAULT 0) PARTITION BY LIST (slot)"
    )
    run(
        f"CREATE TABLE __S__.queue_throughput ({_THROUGHPUT_COLUMNS}, jobs bigint NOT NULL,"
        " slot smallint NOT NULL DEFAULT 0) PARTITION BY LIST (slot)"
    )
    for table in ("queue_counts", "queue_throughput"):
        for name, slot in _SLOTS.items():
            run(
                f"CREATE TABLE __S__.{table}_{name} PARTITION OF __S__.{table}"
                f" FOR VALUES IN ({slot})"
            )
            # The journal slots are emptied by TRUNCATE: autovacuum has nothing to do there.
            if slot != 0:
                run(f"ALTER TABLE __S__.{table}_{name} SET (autovacuum_enabled = false)")
    run(
        "ALTER TABLE __S__.queue_counts_totals ADD CONSTRAINT uq_queue_counts_totals"
        " UNIQUE (queue, status)"
    )
    run(
        "ALTER TABLE __S__.queue_throughput_totals ADD CONSTRAINT uq_queue_throughput_totals"
        " UNIQUE (queue, minute, outcome)"
    )
    # The prune and the window reads walk the sums by minute; the journal slots stay small.
    run("CREATE INDEX ix_queue_throughput_totals_minute ON __S__.queue_throughput_totals (minute)")

    run(
        "INSERT INTO __S__.queue_counts (queue, status, slot, jobs)"
        " SELECT queue, status, 0, sum(jobs) FROM __S__.queue_counts_0027"
        " GROUP BY queue, status HAVING sum(jobs) <> 0"
    )
    run(
        "INSERT INTO __S__.queue_throughput (queue, minute, outcome, slot, jobs)"
        " SELECT queue, minute, outcome, 0, sum(jobs) FROM __S__.queue_throughput_0027"
        " GROUP BY queue, minute, outcome"
    )
    for table in ("queue_counts", "queue_throughput"):
        for new in (table, *(f"{table}_{name}" for name in _SLOTS)):
            _copy_grants(run, f"{table}_0027", new)
        run(f"DROP TABLE __S__.{table}_0027")

    run(_COUNTS)
    run(_FOLD)
    run("REVOKE ALL ON FUNCTION __S__.jobq_counters_fold(integer) FROM PUBLIC")
    run(_DEFINER_RIGHTS)


def downgrade() -> None:
    run = _runner(_schema())
    run("ALTER TABLE __S__.queue_counts RENAME TO queue_counts_0028")
    run("ALTER TABLE __S__.queue_throughput RENAME TO queue_throughput_0028")
    run(f"CREATE TABLE __S__.queue_counts ({_COUNTS_COLUMNS}, jobs bigint NOT NULL)")
    run(f"CREATE TABLE __S__.queue_throughput ({_THROUGHPUT_COLUMNS}, jobs bigint NOT NULL)")
    run("CREATE INDEX ix_queue_throughput_minute ON __S__.queue_throughput (minute)")
    run(
        "INSERT INTO __S__.queue_counts (queue, status, jobs)"
        " SELECT queue, status, sum(jobs) FROM __S__.queue_counts_0028"
        " GROUP BY queue, status HAVING sum(jobs) <> 0"
    )
    run(
        "INSERT INTO __S__.queue_throughput (queue, minute, outcome, jobs)"
        " SELECT queue, minute, outcome, sum(jobs) FROM __S__.queue_throughput_0028"
        " GROUP BY queue, minute, outcome"
    )
    for table in ("queue_counts", "queue_throughput"):
        _copy_grants(run, f"{table}_0028", table)
    run(_COUNTS_BEFORE)
    run("DROP FUNCTION __S__.jobq_counters_fold(integer)")
    run("DROP TABLE __S__.queue_counts_0028, __S__.queue_throughput_0028")
    run("DROP TABLE __S__.counter_journal_slot")
