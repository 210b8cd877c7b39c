"""Ordering keys across two real ``jobq serve`` processes and 32 HTTP workers (issue 21).

5,000 jobs over 50 keys, enqueued through both instances while the workers run; the workers
fail about one attempt in ten (retried after a short ``retry_after_seconds``) and some jobs for
good (out of attempts, or not retryable), so dead jobs must release the jobs after them. Every
outcome is planned up front from a seeded random generator, so the end state of each job is
known before the run.

Checked from the workers' own record, on the test process's monotonic clock: per key, the
attempts never overlap and come job after job in enqueue order (a retrying job holds the ones
after it). An attempt is timed from the moment its claim returned to the moment before its
complete or fail was sent; the next attempt of the key can only be claimed once that settle
committed, so the intervals of one key are disjoint unless two attempts really ran at once.
Checked from the database, sampled throughout by a read-only connection: at no instant two jobs
of a key are open (scheduled, pending or running) together, and no key has waiting jobs with
none open (a lost turn).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.composing import forget_history
from tests.acceptance.helpers import claim, lease, lease_call
from tests.processes import JobqServers

pytestmark = pytest.mark.acceptance

QUEUE = "ordered"
JOBS = 5000
KEYS = 50
BATCH = 500
WORKERS = 32
# Jobs per claim: of different keys, each key having one due job at most.
MAX_JOBS = 4
SEED = 21
# Of each attempt of an ordinary job: the chance it fails (and is retried).
RETRY_RATE = 0.10
# Of each job: the chance it is doomed to die (half out of attempts, half not retryable).
DOOMED_RATE = 0.02
MAX_ATTEMPTS = 3
# Retries come back at once (pending) or after a few tens of ms (scheduled, then promoted).
RETRY_DELAYS = (0.0, 0.02, 0.05)
LEASE_SECONDS = 60  # no lease expires in this test: every attempt ends by the worker's call
WORK_SECONDS = (0.0, 0.003)
DEADLINE_SECONDS = 150.0
SAMPLE_EVERY_SECONDS = 0.02
# Retries promoted quickly on both instances; no log line per request or job (the run makes
# some 15,000 of them, and writing them costs CPU the test has better use for).
ENV = {"JOBQ_PROMOTER_INTERVAL_SECONDS": "0.02", "JOBQ_LOG_LEVEL": "warning"}

Outcome = Literal["ok", "retry", "fatal"]


@dataclass(frozen=True)
class Plan:
    """What happens to one job: the outcome of each attempt, its attempts, its retry delay."""

    key: str
    outcomes: tuple[Outcome, ...]
    max_attempts: int
    retry_after: float

    @property
    def final(self) -> str:
        return "succeeded" if self.outcomes[-1] == "ok" else "dead"


@dataclass(frozen=True)
class Attempt:
    """One attempt as a worker saw it, timed on the test process's monotonic clock."""

    key: str
    job_id: int
    attempt: int
    start: float  # just after the claim returned
    end: float  # just before the complete or fail was sent
    outcome: Outcome
    worker: str


@dataclass
class Run:
    """What the workers saw."""

    attempts: list[Attempt] = field(default_factory=list)
    finished: set[int] = field(default_factory=set)
    wrong_verdicts: list[str] = field(default_factory=list)


def make_plans(rng: random.Random) -> list[Plan]:
    """The plan of every job, in enqueue order."""
    plans = []
    for _ in range(JOBS):
        key = f"key-{rng.randrange(KEYS):02d}"
        retry_after = rng.choice(RETRY_DELAYS)
        if rng.random() < DOOMED_RATE:
            if rng.random() < 0.5:
                plans.append(Plan(key, ("retry", "retry"), 2, retry_after))
            else:
                plans.append(Plan(key, ("retry", "fatal"), MAX_ATTEMPTS, retry_after))
            continue
        outcomes: list[Outcome] = []
        while len(outcomes) < MAX_ATTEMPTS:
            outcomes.append("retry" if rng.random() < RETRY_RATE else "ok")
            if outcomes[-1] == "ok":
                break
        plans.append(Plan(key, tuple(outcomes), MAX_ATTEMPTS, retry_after))
    return plans


def expected_status(plan: Plan, attempt: int) -> str:
    """The state a settle of ``attempt`` must answer."""
    outcome = plan.outcomes[attempt - 1]
    if outcome == "ok":
        return "succeeded"
    if outcome == "fatal" or attempt >= plan.max_attempts:
        return "dead"
    return "pending" if plan.retry_after == 0 else "scheduled"


async def enqueue_all(
    clients: list[httpx.AsyncClient], plans: list[Plan]
) -> dict[int, tuple[int, Plan]]:
    """Enqueues the jobs in batches, alternating instances, one batch after the other (so the
    enqueue order of a key is its jobs' id order); answers each job's position and plan by id."""
    by_id: dict[int, tuple[int, Plan]] = {}
    last_id = 0
    for b, lo in enumerate(range(0, JOBS, BATCH)):
        body = {
            "jobs": [
                {
                    "queue": QUEUE,
                    "type": "ordered",
                    "payload": {"n": n},
                    "ordering_key": plans[n].key,
                    "max_attempts": plans[n].max_attempts,
                    "lease_seconds": LEASE_SECONDS,
                }
                for n in range(lo, min(lo + BATCH, JOBS))
            ]
        }
        r = await clients[b % 2].post("/v1/jobs/batch", json=body)
        assert r.status_code == 201, r.text
        for offset, job in enumerate(r.json()["jobs"]):
            n = lo + offset
            assert job["payload"] == {"n": n} and job["ordering_key"] == plans[n].key, job
            assert job["status"] in ("pending", "waiting"), job
            assert job["id"] > last_id, "ids do not follow the enqueue order"
            last_id = job["id"]
            by_id[job["id"]] = (n, plans[n])
    return by_id


async def worker(
    client: httpx.AsyncClient,
    worker_id: str,
    plans: list[Plan],
    enqueued: asyncio.Event,
    run: Run,
    rng: random.Random,
) -> None:
    """Claims up to MAX_JOBS jobs at a time (of different keys, as only a key's head is due) and
    settles each as its plan says, until every job finished: the successes in one complete,
    then the failures in one fail."""
    while not (enqueued.is_set() and len(run.finished) == JOBS):
        jobs = await claim(client, worker_id, QUEUE, max_jobs=MAX_JOBS, wait_seconds=0.5)
        if not jobs:
            continue
        start = time.monotonic()
        held: dict[Outcome, list[tuple[dict[str, Any], Plan]]] = defaultdict(list)
        for job in jobs:
            # By the payload: a job may be claimed before its batch's answer is back.
            plan = plans[job["payload"]["n"]]
            if job["attempt"] > len(plan.outcomes):
                run.wrong_verdicts.append(f"job {job['id']} claimed for attempt {job['attempt']}")
                return
            held[plan.outcomes[job["attempt"] - 1]].append((job, plan))
        await asyncio.sleep(rng.uniform(*WORK_SECONDS))  # the work
        for op, outcomes in (("complete", ("ok",)), ("fail", ("retry", "fatal"))):
            items = []
            end = time.monotonic()
            for outcome in outcomes:
                for job, plan in held[outcome]:
                    attempt = job["attempt"]
                    run.attempts.append(
                        Attempt(plan.key, job["id"], attempt, start, end, outcome, worker_id)
                    )
                    if outcome == "ok":
                        items.append(lease(job, result={"n": job["payload"]["n"]}))
                    elif outcome == "fatal":
                        items.append(lease(job, error="planned failure", retryable=False))
                    else:
                        items.append(
                            lease(
                                job, error="planned failure", retry_after_seconds=plan.retry_after
                            )
                        )
            if not items:
                continue
            verdicts = await lease_call(client, op, worker_id, items)
            settled = [pair for outcome in outcomes for pair in held[outcome]]
            for (job, plan), verdict in zip(settled, verdicts, strict=True):
                wanted = expected_status(plan, job["attempt"])
                if not verdict["ok"] or verdict["status"] != wanted:
                    run.wrong_verdicts.append(
                        f"job {job['id']} attempt {job['attempt']}: {verdict}, not {wanted}"
                    )
                if verdict["status"] in ("succeeded", "dead"):
                    run.finished.add(job["id"])


@dataclass
class Samples:
    """What the database sampler saw."""

    taken: int = 0
    busiest: int = 0  # most keys with an open job in one sample
    two_open: list[str] = field(default_factory=list)
    stalled: list[str] = field(default_factory=list)


async def sample(engine: AsyncEngine, done: asyncio.Event, samples: Samples) -> None:
    """Reads each key's open and waiting jobs in one snapshot, again and again until ``done``."""
    statement = text(
        "SELECT ordering_key, count(*) FILTER (WHERE status <> 'waiting') AS open, "
        "count(*) FILTER (WHERE status = 'waiting') AS waiting, "
        "array_agg(id || ':' || status ORDER BY id) FILTER (WHERE status <> 'waiting') AS jobs "
        "FROM jobs WHERE queue = :q "
        "AND status IN ('waiting', 'scheduled', 'pending', 'running') GROUP BY 1"
    )
    async with engine.connect() as conn:
        while not done.is_set():
            await conn.execute(text("SET TRANSACTION READ ONLY"))
            rows = (await conn.execute(statement, {"q": QUEUE})).all()
            await conn.commit()  # each sample its own snapshot
            samples.taken += 1
            samples.busiest = max(samples.busiest, sum(1 for r in rows if r.open > 0))
            for r in rows:
                if r.open > 1:
                    samples.two_open.append(f"{r.ordering_key}: {r.jobs}")
                if r.open == 0 and r.waiting > 0:
                    samples.stalled.append(f"{r.ordering_key}: {r.waiting} waiting, none open")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(done.wait(), SAMPLE_EVERY_SECONDS)


async def test_ordering_keys_run_one_at_a_time_in_enqueue_order_across_two_instances(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    await forget_history(clean_db)
    rng = random.Random(SEED)
    plans = make_plans(rng)
    expected_keys = Counter(p.key for p in plans)
    assert len(expected_keys) == KEYS
    assert sum(p.final == "dead" for p in plans) >= 20, "the plan has dead jobs to release"
    assert sum(o == "retry" for p in plans for o in p.outcomes) >= JOBS // 20

    servers = await asyncio.gather(jobq_servers.start(ENV), jobq_servers.start(ENV))
    run = Run()
    samples = Samples()
    by_id: dict[int, tuple[int, Plan]] = {}
    enqueued = asyncio.Event()
    done = asyncio.Event()
    started = time.monotonic()
    async with contextlib.AsyncExitStack() as stack:
        clients = [
            await stack.enter_async_context(httpx.AsyncClient(base_url=s.url, timeout=30.0))
            for s in servers
        ]
        sampler = asyncio.create_task(sample(clean_db, done, samples))
        try:
            async with asyncio.timeout(DEADLINE_SECONDS), asyncio.TaskGroup() as group:
                # The workers start first: enqueues race with the finishes of each key's head.
                for index in range(WORKERS):
                    group.create_task(
                        worker(
                            clients[index % 2],
                            f"w{index:02d}",
                            plans,
                            enqueued,
                            run,
                            random.Random(SEED * 1000 + index),
                        )
                    )
                by_id.update(await enqueue_all(clients, plans))
                enqueued.set()
        except TimeoutError:
            pytest.fail(
                f"not every job finished within {DEADLINE_SECONDS} s: {len(run.finished)} of "
                f"{JOBS} finished, {len(run.attempts)} attempts; wrong: {run.wrong_verdicts[:5]}"
            )
        finally:
            done.set()
            await sampler
    seconds = time.monotonic() - started

    assert run.wrong_verdicts == [], run.wrong_verdicts[:10]
    assert len(by_id) == JOBS

    # Every job ended as planned, succeeded or dead, with exactly its planned attempts.
    async with clean_db.connect() as conn:
        rows = (
            await conn.execute(
                text("SELECT id, status, attempts, ordering_key FROM jobs WHERE queue = :q"),
                {"q": QUEUE},
            )
        ).all()
    assert {r.id for r in rows} == set(by_id)
    wrong_end = [
        (r.id, r.status, r.attempts, by_id[r.id][1])
        for r in rows
        if (r.status, r.attempts, r.ordering_key)
        != (by_id[r.id][1].final, len(by_id[r.id][1].outcomes), by_id[r.id][1].key)
    ]
    assert wrong_end == [], f"jobs that did not end as planned: {wrong_end[:10]}"

    # Each attempt was seen once, numbered 1, 2, ... per job.
    seen = Counter((a.job_id, a.attempt) for a in run.attempts)
    assert [k for k, n in seen.items() if n > 1] == [], "an attempt was claimed twice"
    assert set(seen) == {
        (job_id, k) for job_id, (_, plan) in by_id.items() for k in range(1, len(plan.outcomes) + 1)
    }

    enqueue_order: dict[str, list[int]] = defaultdict(list)
    for job_id in sorted(by_id):
        enqueue_order[by_id[job_id][1].key].append(job_id)
    per_key: dict[str, list[Attempt]] = defaultdict(list)
    for a in run.attempts:
        per_key[a.key].append(a)

    overlaps: list[str] = []
    out_of_order: list[str] = []
    for key, attempts in per_key.items():
        attempts.sort(key=lambda a: a.start)
        # (b) No two attempts of a key overlap: each ended (settle sent) before the next began.
        for before, after in itertools.pairwise(attempts):
            if not before.end < after.start:
                overlaps.append(f"{key}: {before} and {after}")
        # Attempts come job after job in enqueue order: all of a job's attempts (its retries
        # included) before any of the next job's, and no job skipped, dead ones included.
        sequence = [a.job_id for a in attempts]
        runs = [job_id for i, job_id in enumerate(sequence) if i == 0 or sequence[i - 1] != job_id]
        if runs != enqueue_order[key]:
            out_of_order.append(f"{key}: ran {runs[:20]}..., enqueued {enqueue_order[key][:20]}...")
        # (a) The final successful attempts started in enqueue order.
        successes = [a.job_id for a in attempts if a.outcome == "ok"]
        wanted = [j for j in enqueue_order[key] if by_id[j][1].final == "succeeded"]
        if successes != wanted:
            out_of_order.append(f"{key}: successes {successes[:20]}..., wanted {wanted[:20]}...")
    assert overlaps == [], f"{len(overlaps)} overlapping attempts of one key: {overlaps[:5]}"
    assert out_of_order == [], out_of_order[:5]

    # The database never showed two open jobs of a key, nor a key left waiting with none open.
    assert samples.two_open == [], samples.two_open[:10]
    assert samples.stalled == [], samples.stalled[:10]
    assert samples.taken >= 20, f"the sampler saw too little of the run ({samples.taken} samples)"
    assert samples.busiest >= KEYS // 2, f"at most {samples.busiest} keys were seen busy at once"

    by_worker_instance = Counter(int(a.worker[1:]) % 2 for a in run.attempts)
    assert by_worker_instance[0] > 0 and by_worker_instance[1] > 0, by_worker_instance
    print(
        f"\n{JOBS} jobs over {KEYS} ordering keys, {WORKERS} workers on 2 instances: "
        f"{len(run.attempts)} attempts "
        f"({sum(a.outcome != 'ok' for a in run.attempts)} failed), "
        f"{sum(p.final == 'dead' for p in plans)} dead, in {seconds:.1f} s; "
        f"{samples.taken} samples, up to {samples.busiest} keys busy at once"
    )
