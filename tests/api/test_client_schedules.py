"""The Client's schedule calls against the real service."""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from jobq_client import JobqError
from tests.api.client_helpers import running_service


async def test_schedules_round_trip(database_url: str, clean_db: AsyncEngine) -> None:
    async with running_service(database_url) as service, service.client() as client:
        made = await client.put_schedule(
            "nightly-report",
            {"queue": "reports", "type": "report", "payload": {"format": "pdf"}},
            cron="30 2 * * *",
            timezone="Europe/Berlin",
            catch_up=1,
        )
        assert made["cron"] == "30 2 * * *" and made["timezone"] == "Europe/Berlin"
        assert made["template"]["payload"] == {"format": "pdf"} and made["catch_up"] == 1
        assert (await client.get_schedule("nightly-report"))["next_run_at"] == made["next_run_at"]
        assert [s["name"] for s in (await client.schedules())["schedules"]] == ["nightly-report"]
        assert (await client.pause_schedule("nightly-report"))["paused"] is True
        assert (await client.resume_schedule("nightly-report"))["paused"] is False
        triggered = await client.trigger_schedule("nightly-report")
        assert (triggered["queue"], triggered["type"]) == ("reports", "report")
        assert triggered["payload"] == {"format": "pdf"} and triggered["status"] == "pending"
        assert (await client.get_schedule("nightly-report"))["next_run_at"] == made["next_run_at"]
        assert (await client.delete_schedule("nightly-report"))["name"] == "nightly-report"
        with pytest.raises(JobqError) as missing:
            await client.get_schedule("nightly-report")
        assert missing.value.status == 404
        with pytest.raises(JobqError) as bad:
            await client.put_schedule("x", {"type": "t"}, cron="61 * * * *")
        assert bad.value.status == 422
    async with clean_db.begin() as conn:
        await conn.execute(text("TRUNCATE schedules"))
