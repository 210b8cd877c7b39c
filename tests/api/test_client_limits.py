"""The Client's limit calls and concurrency keys against the real service."""

from __future__ import annotations

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobqError
from tests.api.client_helpers import running_service


async def test_limits_round_trip_and_bind_claims(database_url: str, clean_db: AsyncEngine) -> None:
    async with running_service(database_url) as service, service.client() as client:
        limit = await client.set_limit("key", "customer:*", max_running=1, rate=(10, 60.0))
        assert limit["max_running"] == 1 and limit["rate"] == {"limit": 10, "per_seconds": 60.0}
        first = await client.enqueue("t", concurrency_key="customer:1")
        await client.enqueue("t", concurrency_key="customer:1")
        assert first["concurrency_key"] == "customer:1"
        claimed = await client.claim("w", ["default"], max_jobs=5)
        assert [j["id"] for j in claimed] == [first["id"]]
        [listed] = await client.limits()
        assert listed["id"] == limit["id"] and listed["running"] == 1
        assert (await client.delete_limit(limit["id"]))["pattern"] == "customer:*"
        assert await client.limits() == []
        with pytest.raises(JobqError) as missing:
            await client.delete_limit(limit["id"])
        assert missing.value.status == 404
        with pytest.raises(JobqError) as bad:
            await client.set_limit("key", "k")
        assert bad.value.status == 422
