"""A leader change and a kill -9 mid-workflow, with real ``jobq serve`` processes (issue 21).

Two instances run twenty workflows (a diamond then a chain: a -> b, a -> c, b + c -> d -> e ->
f) and four batches with callbacks, worked by HTTP workers split across both. Once a third of
the jobs are done and workers of the maintenance leader hold jobs, the leader is killed with
SIGKILL, and its workers die with it (they stop at their next call): their leases must expire
and the survivor, now the leader, must reap them and hand the jobs out again. The killed
instance is then started again and gets new workers.

Checked at the end, through the API (jobs, workflows, each job's history) and the workers' own
record: every workflow succeeded; no step was claimed before each of its parents had succeeded
(database times from the history, and the test's monotonic clock where a worker saw the claim);
no job completed twice or was claimed after it succeeded; a job took more than one attempt only
when a lease granted by the killed instance expired; each batch has exactly one callback, run
once (or cancelled, never claimed, when its batch failed and it asked for all to succeed), and
told the right counts of its batch's outcomes.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import signal
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import httpx
import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.acceptance.composing import forget_history, is_leader, job_events
from tests.polling import poll_until
from tests.processes import JobqServer, JobqServers

pytestmark = pytest.mark.acceptance

QUEUE = "workflows"
WORKFLOWS = 20
# A diamond, then a chain.
STEPS = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": ["d"], "f": ["e"]}
WORKERS_PER_INSTANCE = 6
WORK_SECONDS = (0.1, 0.3)
LEASE_SECONDS = 3
KILL_AFTER_FRACTION = 0.35
DEADLINE_SECONDS = 90.0
SEED = 21
# Fast maintenance: the survivor takes the leader lock within a fraction of a second of the
# kill, reaps every 0.2 s, and a reaped job is due again within 0.2 s.
ENV = {
    "JOBQ_REAPER_INTERVAL_SECONDS": "0.2",
    "JOBQ_ELECTION_INTERVAL_SECONDS": "0.3",
    "JOBQ_BACKOFF_BASE_SECONDS": "0.2",
}


@dataclass(frozen=True)
class BatchSpec:
    """A batch: how many jobs succeed and how many die, and when its callback runs."""

    ok: int
    doomed: int
    when: str

    @property
    def callback_runs(self) -> bool:
        return self.doomed == 0 or self.when == "all_finished"


BATCHES = (
    BatchSpec(ok=10, doomed=0, when="all_succeeded"),
    BatchSpec(ok=8, doomed=2, when="all_finished"),
    BatchSpec(ok=9, doomed=1, when="all_succeeded"),  # its callback is cancelled
    BatchSpec(ok=10, doomed=0, when="all_finished"),
)


@dataclass(frozen=True)
class Claimed:
    """A claim a worker saw return, on the test's monotonic clock."""

    job_id: int
    attempt: int
    at: float
    instance: str
    worker: str
    parents: dict[str, Any] | None


@dataclass(frozen=True)
class Settle:
    """A complete or fail a worker sent (at: just before sending) and what it learned."""

    job_id: int
    attempt: int
    at: float
    op: str
    answer: str  # the verdict's status, "lease_lost", or "unknown" when the instance died


@dataclass
class Log:
    """What every worker saw."""

    claims: list[Claimed] = field(default_factory=list)
    settles: list[Settle] = field(default_factory=list)
    # Worker -> (job id, attempt) it is working on (claimed, settle not sent yet).
    holding: dict[str, tuple[int, int]] = field(default_factory=dict)
    dead_workers: list[str] = field(default_factory=list)
    surprises: list[str] = field(default_factory=list)

    def done(self) -> int:
        return sum(s.answer in ("succeeded", "dead") for s in self.settles)


async def worker(
    server: JobqServer,
    client: httpx.AsyncClient,
    worker_id: str,
    stop: asyncio.Event,
    log: Log,
    rng: random.Random,
    *,
    may_die: bool,
) -> None:
    """Claims one job at a time, works a while, completes it (fails a doomed one for good).

    A worker of an instance that may die dies with it: at its first failed call it stops,
    abandoning the job it holds, whose lease then expires.
    """

    def died(what: str) -> None:
        if not may_die:
            log.surprises.append(f"{worker_id}: {what}")
        log.dead_workers.append(worker_id)
        log.holding.pop(worker_id, None)

    while not stop.is_set():
        body = {
            "worker_id": worker_id,
            "queues": [QUEUE],
            "lease_seconds": LEASE_SECONDS,
            "wait_seconds": 0.5,
        }
        try:
            r = await client.post("/v1/claim", json=body)
        except httpx.TransportError as exc:
            return died(f"claim: {exc!r}")
        if r.status_code != 200:
            return died(f"claim answered {r.status_code}: {r.text[:300]}")
        for job in r.json()["jobs"]:
            log.holding[worker_id] = (job["id"], job["attempt"])
            log.claims.append(
                Claimed(
                    job["id"],
                    job["attempt"],
                    time.monotonic(),
                    server.name,
                    worker_id,
                    job.get("parents"),
                )
            )
            await asyncio.sleep(rng.uniform(*WORK_SECONDS))  # the work
            item: dict[str, Any] = {"job_id": job["id"], "lease_id": job["lease_id"]}
            if job["type"] == "doomed":
                op = "fail"
                item |= {"error": "doomed", "retryable": False}
            else:
                op = "complete"
                item["result"] = {"by": worker_id, "attempt": job["attempt"]}
            log.holding.pop(worker_id, None)  # from here its outcome may be unknown
            sent = time.monotonic()
            try:
                r = await client.post(f"/v1/{op}", json={"worker_id": worker_id, "leases": [item]})
            except httpx.TransportError as exc:
                log.settles.append(Settle(job["id"], job["attempt"], sent, op, "unknown"))
                return died(f"{op}: {exc!r}")
            if r.status_code != 200:
                log.settles.append(Settle(job["id"], job["attempt"], sent, op, "unknown"))
                return died(f"{op} answered {r.status_code}: {r.text[:300]}")
            [verdict] = r.json()["results"]
            answer = verdict["status"] if verdict["ok"] else str(verdict["error"])
            log.settles.append(Settle(job["id"], job["attempt"], sent, op, answer))
            if answer not in ("succeeded", "dead"):
                log.surprises.append(f"{worker_id}: {op} of job {job['id']}: {verdict}")


class Crew:
    """The workers of the run, each attached to one instance."""

    def __init__(self, log: Log) -> None:
        self.log = log
        self.stop = asyncio.Event()
        self.tasks: dict[str, list[asyncio.Task[None]]] = defaultdict(list)
        self.stack = contextlib.AsyncExitStack()

    async def hire(self, server: JobqServer, *, may_die: bool) -> None:
        client = await self.stack.enter_async_context(
            httpx.AsyncClient(base_url=server.url, timeout=30.0)
        )
        for i in range(WORKERS_PER_INSTANCE):
            name = f"{server.name}/w{i}"
            rng = random.Random(f"{SEED}:{name}")
            self.tasks[server.name].append(
                asyncio.create_task(
                    worker(server, client, name, self.stop, self.log, rng, may_die=may_die),
                    name=name,
                )
            )

    def workers_of(self, server: JobqServer) -> list[str]:
        return [t.get_name() for t in self.tasks[server.name]]

    async def close(self) -> None:
        self.stop.set()
        tasks = [t for ts in self.tasks.values() for t in ts]
        try:
            async with asyncio.timeout(15):
                outcomes = await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            for t in tasks:
                t.cancel()
            await self.stack.aclose()
        errors = [o for o in outcomes if isinstance(o, BaseException)]
        if errors:
            raise errors[0]


async def create_work(
    clients: list[httpx.AsyncClient],
) -> tuple[list[int], list[tuple[BatchSpec, list[int], list[int], int]]]:
    """Creates the workflows and the batches through both instances; answers the workflow ids,
    and per batch its spec, its ok and doomed job ids and its callback's id."""

    async def workflow(k: int) -> int:
        body = {
            "name": f"crash-{k}",
            "steps": [
                {"name": s, "after": after, "queue": QUEUE, "type": "step", "payload": {"k": k}}
                for s, after in STEPS.items()
            ],
        }
        r = await clients[k % 2].post("/v1/workflows", json=body)
        assert r.status_code == 201, r.text
        created = r.json()
        states = {s["name"]: s["job"]["status"] for s in created["steps"]}
        assert states == {s: "pending" if not a else "waiting" for s, a in STEPS.items()}, states
        workflow_id: int = created["id"]
        return workflow_id

    async def batch(b: int, spec: BatchSpec) -> tuple[BatchSpec, list[int], list[int], int]:
        jobs = [{"queue": QUEUE, "type": "batch", "payload": {"b": b}}] * spec.ok + [
            {"queue": QUEUE, "type": "doomed", "payload": {"b": b}, "max_attempts": 1}
        ] * spec.doomed
        callback = {"queue": QUEUE, "type": "callback", "payload": {"b": b}, "when": spec.when}
        r = await clients[b % 2].post("/v1/jobs/batch", json={"jobs": jobs, "callback": callback})
        assert r.status_code == 201, r.text
        answer = r.json()
        ids = [j["id"] for j in answer["jobs"]]
        assert answer["callback"]["status"] == "waiting", answer["callback"]
        assert answer["callback"]["depends_on"] == sorted(ids), answer["callback"]
        return spec, ids[: spec.ok], ids[spec.ok :], answer["callback"]["id"]

    workflows, batches = await asyncio.gather(
        asyncio.gather(*(workflow(k) for k in range(WORKFLOWS))),
        asyncio.gather(*(batch(b, s) for b, s in enumerate(BATCHES))),
    )
    return workflows, batches


async def open_jobs(engine: AsyncEngine) -> int:
    async with engine.connect() as conn:
        n = await conn.scalar(
            text(
                "SELECT count(*) FROM jobs WHERE queue = :q "
                "AND status IN ('waiting', 'scheduled', 'pending', 'running')"
            ),
            {"q": QUEUE},
        )
    return int(n or 0)


def ts(value: str) -> datetime:
    return datetime.fromisoformat(value)


async def test_kill_9_of_the_leader_mid_workflow_loses_and_doubles_nothing(
    jobq_servers: JobqServers, clean_db: AsyncEngine
) -> None:
    await forget_history(clean_db)
    one, two = await asyncio.gather(
        jobq_servers.start({**ENV, "JOBQ_INSTANCE_NAME": "jobq-1"}),
        jobq_servers.start({**ENV, "JOBQ_INSTANCE_NAME": "jobq-2"}),
    )
    log = Log()
    crew = Crew(log)
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            s.name: await stack.enter_async_context(httpx.AsyncClient(base_url=s.url, timeout=30.0))
            for s in (one, two)
        }
        leaders: list[JobqServer] = []

        async def one_leader() -> bool:
            flags = await asyncio.gather(*(is_leader(clients[s.name]) for s in (one, two)))
            leaders[:] = [s for s, flag in zip((one, two), flags, strict=True) if flag]
            return len(leaders) == 1

        await poll_until(one_leader, within=10, what="one maintenance leader")
        [victim] = leaders
        survivor = two if victim is one else one

        workflow_ids, batches = await create_work([clients[one.name], clients[two.name]])
        total = WORKFLOWS * len(STEPS) + sum(s.ok + s.doomed for s in BATCHES)

        try:
            await crew.hire(victim, may_die=True)
            await crew.hire(survivor, may_die=False)

            # Kill the leader mid-run, while its workers hold jobs.
            def time_to_kill() -> bool:
                busy = log.holding.keys() & set(crew.workers_of(victim))
                return log.done() >= KILL_AFTER_FRACTION * total and len(busy) >= 2

            await poll_until(time_to_kill, within=30, what="the moment to kill", interval=0.01)
            held_at_kill = {w: log.holding[w] for w in crew.workers_of(victim) if w in log.holding}
            victim.send_signal(signal.SIGKILL)
            assert await victim.wait_exit(10) == -signal.SIGKILL
            done_at_kill = log.done()
            assert done_at_kill < total

            # The survivor takes over the leader-only loops (the reaper among them).
            survivor_client = clients[survivor.name]
            await poll_until(
                lambda: is_leader(survivor_client), within=10, what="the survivor to lead"
            )
            # The killed instance comes back, with new workers; its old ones are gone.
            restarted = await jobq_servers.start({**ENV, "JOBQ_INSTANCE_NAME": "jobq-3"})
            await crew.hire(restarted, may_die=False)

            async def all_finished() -> bool:
                return await open_jobs(clean_db) == 0

            await poll_until(all_finished, within=DEADLINE_SECONDS, what="every job to finish")
        finally:
            await crew.close()

        assert log.surprises == [], log.surprises[:10]
        assert set(held_at_kill) <= set(log.dead_workers), "the killed instance's workers died"
        assert await is_leader(survivor_client), "the survivor kept the lead"

        api = survivor_client
        # Every workflow succeeded, every step once.
        for workflow_id in workflow_ids:
            r = await api.get(f"/v1/workflows/{workflow_id}")
            assert r.status_code == 200, r.text
            wf = r.json()
            assert wf["state"] == "succeeded", wf
            assert {s["name"]: s["job"]["status"] for s in wf["steps"]} == dict.fromkeys(
                STEPS, "succeeded"
            )

        async with clean_db.connect() as conn:
            rows = {
                r.id: r
                for r in (
                    await conn.execute(
                        text(
                            "SELECT id, type, status, attempts, depends_on, finished_at, "
                            "workflow_id, workflow_step FROM jobs WHERE queue = :q"
                        ),
                        {"q": QUEUE},
                    )
                ).all()
            }
        callbacks = [r for r in rows.values() if r.type == "callback"]
        assert len(rows) == total + len(BATCHES)
        histories = dict(
            zip(
                rows,
                await asyncio.gather(*(job_events(api, job_id) for job_id in rows)),
                strict=True,
            )
        )

    # Each job's history: attempts 1..n claimed, the last one ended it; the ones before it were
    # leases granted by the killed instance that expired; one completion at most, nothing after.
    expired_attempts = 0
    wrong: list[str] = []
    for job_id, row in rows.items():
        events = histories[job_id]
        kinds = Counter(e["kind"] for e in events)
        claims = [e for e in events if e["kind"] == "claimed"]
        if [c["attempt"] for c in claims] != list(range(1, row.attempts + 1)):
            wrong.append(f"job {job_id}: claims {[c['attempt'] for c in claims]}, {row.attempts}")
        completions = [e for e in events if e["kind"] == "completed"]
        if row.status == "succeeded":
            if len(completions) != 1 or completions[0]["attempt"] != row.attempts:
                wrong.append(f"job {job_id} completed {len(completions)} times: {completions}")
            elif any(ts(c["at"]) > ts(completions[0]["at"]) for c in claims):
                wrong.append(f"job {job_id} claimed after it succeeded: {events}")
        elif completions:
            wrong.append(f"job {job_id} is {row.status} but completed: {events}")
        if kinds["failed"] and row.type != "doomed":
            wrong.append(f"job {job_id} failed: {events}")
        expired = [e for e in events if e["kind"] == "lease_expired"]
        expired_attempts += len(expired)
        for e in expired:
            [lost] = [c for c in claims if c["attempt"] == e["attempt"]]
            if lost["instance"] != victim.name:
                wrong.append(f"job {job_id}: a lease of {lost['instance']} expired: {events}")
        ended_early = {e["attempt"] for e in expired}
        if row.attempts and ended_early | {row.attempts} != set(range(1, row.attempts + 1)):
            wrong.append(f"job {job_id}: an attempt ended otherwise than by the kill: {events}")
        expected = {"step": "succeeded", "batch": "succeeded", "doomed": "dead"}.get(row.type)
        if expected is not None and row.status != expected:
            wrong.append(f"job {job_id} ({row.type}) ended {row.status}")
    assert wrong == [], "\n".join(wrong[:10])
    # The jobs the killed instance's workers were working on: their leases expired, and they
    # were run again.
    for job_id, attempt in held_at_kill.values():
        expired_now = [
            e for e in histories[job_id] if e["kind"] == "lease_expired" and e["attempt"] == attempt
        ]
        assert expired_now, f"job {job_id}'s attempt {attempt}, abandoned, did not expire"
        assert rows[job_id].attempts > attempt or rows[job_id].type == "doomed", rows[job_id]

    # No step was claimed before each of its parents succeeded. In the database's time: the
    # parent's completion (its finished_at) is at or before the step's first claim, and the step
    # became due in its last parent's completion (a "ready" event at that parent's time).
    settles_by = {(s.job_id, s.attempt): s for s in log.settles}
    early: list[str] = []
    for job_id, row in rows.items():
        if not row.depends_on:
            continue
        parents = [rows[p] for p in row.depends_on]
        claims = [e for e in histories[job_id] if e["kind"] == "claimed"]
        if row.status == "succeeded":
            assert all(p.status == "succeeded" for p in parents) or row.type == "callback"
        for parent in parents:
            if claims and ts(claims[0]["at"]) < parent.finished_at:
                early.append(
                    f"job {job_id} claimed at {claims[0]['at']}, its parent {parent.id} "
                    f"finished at {parent.finished_at}"
                )
        ready = [e for e in histories[job_id] if e["kind"] == "ready"]
        if claims:
            if len(ready) != 1 or ready[0]["data"]["after"] not in row.depends_on:
                early.append(f"job {job_id}: ready events {ready}")
            elif ts(ready[0]["at"]) != rows[ready[0]["data"]["after"]].finished_at:
                early.append(f"job {job_id} became due at {ready[0]['at']}, not at a finish")
        # On the test's clock: each claim a worker saw returned after the completion that made
        # each parent succeed (or fail) was sent.
        for c in (c for c in log.claims if c.job_id == job_id):
            for parent in parents:
                ended_by = settles_by.get((parent.id, parent.attempts))
                if ended_by is not None and not ended_by.at < c.at:
                    early.append(f"job {job_id} claim {c} before parent's {ended_by}")
    assert early == [], "\n".join(early[:10])

    # Steps: the claim told each one its parents, all succeeded.
    for c in log.claims:
        row = rows[c.job_id]
        if row.type == "step":
            wanted = len(STEPS[row.workflow_step])
            if wanted == 0:
                assert c.parents is None, c
            else:
                assert c.parents is not None, c
                assert (c.parents["total"], c.parents["succeeded"]) == (wanted, wanted), c

    # One callback per batch, run once when its batch allows it, with the right counts.
    assert len(callbacks) == len(BATCHES)
    for spec, ok_ids, doomed_ids, callback_id in batches:
        [callback] = [r for r in callbacks if r.depends_on == sorted(ok_ids + doomed_ids)]
        assert callback.id == callback_id
        seen = [c for c in log.claims if c.job_id == callback_id]
        if not spec.callback_runs:
            assert callback.status == "cancelled" and callback.attempts == 0, callback
            assert seen == [], seen
            continue
        assert callback.status == "succeeded", callback
        final = [c for c in seen if c.attempt == callback.attempts]
        assert final, f"the claim of callback {callback_id}'s last attempt was lost: {seen}"
        told = final[0].parents
        assert told is not None
        assert {k: told[k] for k in ("total", "succeeded", "dead", "cancelled")} == {
            "total": spec.ok + spec.doomed,
            "succeeded": spec.ok,
            "dead": spec.doomed,
            "cancelled": 0,
        }, told
        assert sorted(told["failed_ids"]) == sorted(doomed_ids), told
        assert [p["id"] for p in told["jobs"]] == sorted(ok_ids + doomed_ids), told

    print(
        f"\n{len(workflow_ids)} workflows and {len(BATCHES)} batches ({total} jobs): killed "
        f"{victim.name} (the leader) after {done_at_kill} finished, while "
        f"{len(held_at_kill)} of its workers held jobs; {expired_attempts} leases expired; "
        f"{sum(r.attempts > 1 for r in rows.values())} jobs ran again"
    )
