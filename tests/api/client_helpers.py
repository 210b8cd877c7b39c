"""Helpers for the client's integration tests: the in-process service, running workers, polling."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
from asgi_lifespan import LifespanManager
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.main import create_app
from app.maintenance.reaper import Reaper, ReaperConfig
from app.settings import Settings
from jobq_client import Client, Worker

BASE_URL = "http://jobq.test"


class RecordingTransport(httpx.AsyncBaseTransport):
    """Passes requests on to the app, remembering each one's path and JSON body."""

    def __init__(self, inner: httpx.AsyncBaseTransport) -> None:
        self.inner = inner
        self.calls: list[tuple[str, Any]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        body = request.content
        self.calls.append((request.url.path, json.loads(body) if body else None))
        return await self.inner.handle_async_request(request)

    def items(self, path: str, job_id: int | None = None) -> list[dict[str, Any]]:
        """The lease items sent to ``path``, for one job when ``job_id`` is given."""
        return [
            item
            for p, body in self.calls
            if p == path
            for item in body["leases"]
            if job_id is None or item["job_id"] == job_id
        ]

    def count(self, path: str) -> int:
        """How many requests went to ``path``."""
        return sum(1 for p, _ in self.calls if p == path)


@dataclass
class Service:
    """An in-process jobq app inside its lifespan, reachable through ASGI transports."""

    app: FastAPI
    transports: list[RecordingTransport] = field(default_factory=list)

    def transport(self) -> RecordingTransport:
        """A new recording transport into the app (one per worker, to tell their calls apart)."""
        recording = RecordingTransport(httpx.ASGITransport(app=self.app))
        self.transports.append(recording)
        return recording

    def client(self) -> Client:
        """A client of the app."""
        return Client(BASE_URL, transport=self.transport())

    def worker(self, **options: Any) -> tuple[Worker, RecordingTransport]:
        """A worker on the app, with the transport that records its calls."""
        transport = self.transport()
        return Worker(BASE_URL, transport=transport, **options), transport

    async def expire_and_reap(self, engine: AsyncEngine, job_id: int) -> None:
        """Backdates the job's lease, runs the reaper once, and makes the job due at once.

        A heartbeat of the worker may extend the lease between the two (on a busy machine):
        then both run again, until the reaper took the job.
        """
        service = app_state(self.app).running().services
        reaper = Reaper(services=service, config=ReaperConfig())
        for _ in range(50):
            async with engine.begin() as conn:
                await conn.execute(
                    text(
                        "UPDATE jobs SET lease_expires_at = now() - interval '1 second' "
                        "WHERE id = :id"
                    ),
                    {"id": job_id},
                )
            counts = await reaper.run_once()
            if counts.retried:
                break
        assert counts.retried == 1, counts
        async with engine.begin() as conn:
            await conn.execute(
                text("UPDATE jobs SET run_at = now(), status = 'pending' WHERE id = :id"),
                {"id": job_id},
            )


@asynccontextmanager
async def running_service(database_url: str, **overrides: Any) -> AsyncIterator[Service]:
    """The app on the test database (maintenance off unless asked for) for the span of the block."""
    settings = {"database_url": database_url, "maintenance_enabled": False, **overrides}
    app = create_app(Settings(**settings))
    async with LifespanManager(app):
        yield Service(app=app)
