"""What a claim hands on of a job's parents (issue 40, items 7 and 8a).

A claim carries the results only of parents whose queue the claiming key may read; of the others
it carries the id and the state (``result: null, result_hidden: true``), through ``POST
/v1/claim`` and a settle's ``claim_next`` alike. The inline budget counts only the results that
come inline: a small result behind large ones (by reference) still comes inline.
"""

from __future__ import annotations

from typing import Any

import httpx
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth.keys import Role
from jobq_client import JobContext
from tests.api.helpers import running_app
from tests.keys import as_key, make_key


async def _post(client: httpx.AsyncClient, path: str, body: Any) -> Any:
    r = await client.post(path, json=body)
    assert r.status_code in (200, 201), r.text
    return r.json()


async def _claim(client: httpx.AsyncClient, queue: str, worker: str = "w1") -> dict[str, Any]:
    [job] = (await _post(client, "/v1/claim", {"worker_id": worker, "queues": [queue]}))["jobs"]
    return dict(job)


async def _run(client: httpx.AsyncClient, queue: str, result: Any) -> dict[str, Any]:
    job = await _claim(client, queue, "w0")
    lease = {"job_id": job["id"], "lease_id": job["lease_id"], "result": result}
    await _post(client, "/v1/complete", {"worker_id": "w0", "leases": [lease]})
    return job


async def test_a_claim_carries_only_the_results_of_parents_the_key_may_read(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(database_url, parent_result_inline_max_bytes=100) as client:
        producer = await make_key(clean_db, "ab-producer", Role.PRODUCER, ["qa", "qb"])
        everywhere = await make_key(clean_db, "all-worker", Role.WORKER)
        worker_a = await make_key(clean_db, "a-worker", Role.WORKER, ["qa"])
        await app_state(client.app).running().keys.refresh()  # type: ignore[attr-defined]
        async with (
            as_key(client, producer) as p,
            as_key(client, everywhere) as w,
            as_key(client, worker_a) as a,
        ):
            other = await _post(p, "/v1/jobs", {"queue": "qb", "type": "t"})
            large = await _post(p, "/v1/jobs", {"queue": "qb", "type": "t"})
            own = await _post(p, "/v1/jobs", {"queue": "qa", "type": "t"})
            parents = [other["id"], large["id"], own["id"]]
            child = await _post(p, "/v1/jobs", {"queue": "qa", "type": "c", "depends_on": parents})
            later = await _post(p, "/v1/jobs", {"queue": "qa", "type": "c", "depends_on": parents})
            await _run(w, "qb", {"secret": "of b"})
            await _run(w, "qb", {"secret": "x" * 500})  # too large to come inline
            await _run(w, "qa", {"mine": 1})

            claimed = await _claim(a, "qa")
            assert claimed["id"] == child["id"]
            first, second, third = claimed["parents"]["jobs"]
            for hidden, source in ((first, other), (second, large)):
                assert hidden == {
                    "id": source["id"],
                    "step": None,
                    "status": "succeeded",
                    "result": None,
                    "result_by_reference": False,
                    "result_hidden": True,
                }
            assert third["result"] == {"mine": 1} and third["result_hidden"] is False
            assert claimed["parents"]["succeeded"] == 3
            assert (await a.get(f"/v1/jobs/{other['id']}")).status_code == 403

            # The same through a settle's claim_next.
            settled = await _post(
                a,
                "/v1/complete",
                {
                    "worker_id": "w1",
                    "leases": [{"job_id": claimed["id"], "lease_id": claimed["lease_id"]}],
                    "claim_next": {"queues": ["qa"]},
                },
            )
            [next_job] = settled["claimed"]["jobs"]
            assert next_job["id"] == later["id"]
            assert [j["result_hidden"] for j in next_job["parents"]["jobs"]] == [True, True, False]
            assert [j["result"] for j in next_job["parents"]["jobs"]] == [None, None, {"mine": 1}]

            # A key that may read every queue gets every result, the large one by reference.
            unscoped = await _post(
                p, "/v1/jobs", {"queue": "qa", "type": "c", "depends_on": parents}
            )
            seen = await _claim(w, "qa")
            assert seen["id"] == unscoped["id"]
            results = [(j["result"], j["result_by_reference"]) for j in seen["parents"]["jobs"]]
            assert results == [({"secret": "of b"}, False), (None, True), ({"mine": 1}, False)]

        # The Python client's context neither shows nor fetches a hidden result.
        read: list[int] = []

        async def reader(job_id: int) -> dict[str, Any]:
            read.append(job_id)
            return {"id": job_id, "result": "fetched"}

        ctx = JobContext(claimed, job_reader=reader)
        assert ctx.parent_results == {own["id"]: {"mine": 1}}
        assert await ctx.fetch_parent_results() == {own["id"]: {"mine": 1}}
        assert read == []


async def test_only_results_that_come_inline_count_against_the_claims_budget(
    database_url: str, clean_db: AsyncEngine
) -> None:
    async with running_app(
        database_url, parent_result_inline_max_bytes=100, parent_results_max_bytes=150
    ) as client:
        # Results in depends_on order, and whether each comes inline (at most 100 bytes each,
        # 150 in all, counting only those that come).
        sizes = [
            (300, False),  # too large to come inline: counts for nothing
            (300, False),
            (300, False),
            (60, True),  # 60 of 150
            (95, False),  # 155 would be over 150: by reference, and counts for nothing
            (60, True),  # 120 of 150 (read after the others: the first read stopped at 95)
            (31, False),  # 151 would be over 150
        ]
        parents = [await _post(client, "/v1/jobs", {"queue": "p", "type": "t"}) for _ in sizes]
        child = await _post(
            client,
            "/v1/jobs",
            {"queue": "c", "type": "c", "depends_on": [p["id"] for p in parents]},
        )
        results = []
        for size, _ in sizes:
            # As jsonb prints it, {"s": "..."} is size bytes of text.
            results.append({"s": "x" * (size - 9)})
            await _run(client, "p", results[-1])
        claimed = await _claim(client, "c")
        assert claimed["id"] == child["id"]
        handed = [(j["result"], j["result_by_reference"]) for j in claimed["parents"]["jobs"]]
        assert handed == [
            (result if inline else None, not inline)
            for result, (_, inline) in zip(results, sizes, strict=True)
        ]
