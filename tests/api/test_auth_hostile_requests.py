"""Hostile and malformed requests, each with its documented 4xx, answered cleanly and changing nothing.

The issue's acceptance table. Every row is sent with a valid key of the right role (admin unless
the row is about authentication) against seeded state: a pending job enqueued with an
idempotency key, and a job leased to worker ``w``. For every row the answer is the row's 4xx as
``application/problem+json``; it carries no traceback, no SQL and no secret (neither a test
key's nor the ``Authorization`` value sent); and the database is exactly as it was: a digest of
every row of ``jobs``, ``queues`` and ``api_keys`` (and the per-queue counts) before and after.

tests/api/test_hostile_input.py checks the field each 422 names; this table adds the keys, the
database check and the cases that need seeded state (leases, idempotency keys, revocation).
The app runs with ``max_body_bytes=64 KiB`` (tests/api/conftest.py): every body larger than
that is a 413 before it is parsed, whatever it holds.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.api.state import app_state
from app.auth import store
from tests.keys import Keys, as_key

LIMIT = 64 * 1024  # the app fixture's max_body_bytes
BATCH_MAX = 1000  # Settings.batch_max_jobs' default
SEED_IDEMPOTENCY_KEY = "seed-key"

# What an answer must never contain: a traceback, SQL or the driver's words.
TRACES = ("Traceback", 'File "')
SQL = ("SELECT", "INSERT", "UPDATE jobs", "DROP TABLE jobs")
DRIVER = ("sqlstate", "asyncpg", "sqlalchemy", "psycopg")


@dataclass(frozen=True)
class Seed:
    """What the rows may refer to: a pending job (enqueued with an idempotency key) and a lease."""

    pending: dict[str, Any]
    leased: dict[str, Any]  # the claimed job, with its lease_id

    def lease(self, **extra: Any) -> dict[str, Any]:
        return {"job_id": self.leased["id"], "lease_id": self.leased["lease_id"], **extra}

    def fill(self, path: str) -> str:
        return path.format(pending=self.pending["id"], leased=self.leased["id"])


Setup = Callable[[FastAPI, AsyncEngine], Awaitable[None]]


@dataclass(frozen=True)
class Hostile:
    """One row: a request, who sends it and the 4xx it must get."""

    id: str
    method: str
    path: str  # may name {pending} or {leased}
    status: int
    json: Any = None  # a value, or a function of the seed; sent as JSON
    content: bytes | Callable[[Seed], bytes] | None = None  # raw bytes instead
    stream: bool = False  # send ``content`` as a generator: chunked, no Content-Length
    content_type: str | None = "application/json"  # of ``content``; None: no header
    headers: Mapping[str, str] = field(default_factory=dict)
    # Whose key: a Keys field name, or None for no Authorization header at all.
    key: str | None = "admin"
    # An Authorization header sent as is (instead of ``key``); may name {admin}.
    authorization: str | None = None
    setup: Setup | None = None  # runs after seeding, before the database snapshot


def _json_bytes(body: str) -> bytes:
    return body.encode("utf-8")


def _enqueue(**fields: Any) -> dict[str, Any]:
    return {"queue": "emails", "type": "t", **fields}


def _claim(**fields: Any) -> dict[str, Any]:
    return {"worker_id": "w", "queues": ["emails"], **fields}


def _deep(levels: int) -> bytes:
    return b'{"type": "t", "payload": ' + b"[" * levels + b"]" * levels + b"}"


async def _revoke_producer(app: FastAPI, engine: AsyncEngine) -> None:
    async with engine.begin() as conn:
        assert await store.revoke_key(conn, name="producer")
    await app_state(app).running().keys.refresh()


CASES: list[Hostile] = [
    # --- size -------------------------------------------------------------------------------
    Hostile(
        "oversized-with-content-length",
        "POST",
        "/v1/jobs",
        413,
        content=b'{"type": "t", "payload": "' + b"x" * (LIMIT + 1) + b'"}',
    ),
    Hostile(
        "oversized-chunked-no-content-length",
        "POST",
        "/v1/jobs",
        413,
        content=b'{"type": "t", "payload": "' + b"x" * (LIMIT + 1) + b'"}',
        stream=True,
    ),
    Hostile(
        "oversized-chunked-to-claim",
        "POST",
        "/v1/claim",
        413,
        content=b'{"worker_id": "' + b"w" * (LIMIT + 1) + b'", "queues": ["emails"]}',
        stream=True,
    ),
    Hostile(
        "oversized-to-a-route-without-body",
        "POST",
        "/v1/queues/emails/pause",
        413,
        content=b"{" + b" " * (LIMIT + 1) + b"}",
    ),
    Hostile(
        "oversized-chunked-to-a-route-without-body",
        "POST",
        "/v1/jobs/{pending}/cancel",
        413,
        content=b"{" + b" " * (LIMIT + 1) + b"}",
        stream=True,
    ),
    Hostile(
        "oversized-text-plain-to-a-hot-route",
        "POST",
        "/v1/jobs",
        413,
        content=b"x" * (LIMIT + 1),
        content_type="text/plain",
    ),
    # 100,000 levels take 200 KB: over the body limit, refused before any parser sees it.
    # (Sent without a content type, which is read as JSON too.)
    Hostile("json-100000-deep", "POST", "/v1/jobs", 413, content=_deep(100_000), content_type=None),
    # Under the body limit the depth check answers.
    Hostile("json-30000-deep", "POST", "/v1/jobs", 422, content=_deep(30_000)),
    Hostile(
        "fail-with-1mib-error-text",
        "POST",
        "/v1/fail",
        413,
        json=lambda s: {"worker_id": "w", "leases": [s.lease(error="e" * (1024 * 1024))]},
    ),
    Hostile(
        "batch-over-batch-max-jobs",
        "POST",
        "/v1/jobs/batch",
        422,
        json={"jobs": [{"type": "t"}] * (BATCH_MAX + 1)},
    ),
    Hostile("batch-empty", "POST", "/v1/jobs/batch", 422, json={"jobs": []}),
    # --- bytes the storage cannot hold --------------------------------------------------------
    Hostile(
        "invalid-utf8", "POST", "/v1/jobs", 422, content=b'{"queue": "emails", "type": "\xff\xfe"}'
    ),
    Hostile(
        "nul-in-string",
        "POST",
        "/v1/jobs",
        422,
        content=_json_bytes('{"queue": "emails", "type": "t\\u0000"}'),
    ),
    Hostile(
        "nul-in-worker-id",
        "POST",
        "/v1/claim",
        422,
        content=_json_bytes('{"worker_id": "w\\u0000", "queues": ["emails"]}'),
    ),
    Hostile(
        "lone-surrogate",
        "POST",
        "/v1/jobs",
        422,
        content=_json_bytes('{"queue": "emails", "type": "t", "payload": "\\ud800"}'),
    ),
    Hostile("nan", "POST", "/v1/jobs", 422, content=_json_bytes('{"type": "t", "priority": NaN}')),
    Hostile(
        "infinity",
        "POST",
        "/v1/claim",
        422,
        content=_json_bytes('{"worker_id": "w", "queues": ["emails"], "wait_seconds": Infinity}'),
    ),
    Hostile(
        "nan-checkpoint-on-held-lease",
        "POST",
        "/v1/heartbeat",
        422,
        content=lambda s: _json_bytes(
            '{"worker_id": "w", "leases": [{"job_id": '
            + str(s.leased["id"])
            + ', "lease_id": "'
            + s.leased["lease_id"]
            + '", "lease_seconds": 3600, "checkpoint": {"at": NaN}}]}'
        ),
    ),
    # --- ambiguous JSON -----------------------------------------------------------------------
    Hostile(
        "duplicate-key",
        "POST",
        "/v1/jobs",
        422,
        content=_json_bytes('{"queue": "emails", "type": "t", "type": "u"}'),
    ),
    Hostile(
        "duplicate-key-nested",
        "POST",
        "/v1/jobs",
        422,
        content=_json_bytes('{"queue": "emails", "type": "t", "payload": {"a": 1, "a": 2}}'),
    ),
    Hostile(
        "duplicate-queue-key-on-claim",
        "POST",
        "/v1/claim",
        422,
        content=_json_bytes('{"worker_id": "w", "queues": ["x"], "queues": ["emails"]}'),
    ),
    Hostile("body-is-an-array", "POST", "/v1/jobs", 422, json=[_enqueue()]),
    Hostile("body-is-null", "POST", "/v1/claim", 422, content=b"null"),
    Hostile("body-empty", "POST", "/v1/jobs", 422, content=b"", content_type="application/json"),
    Hostile("body-truncated", "POST", "/v1/jobs", 422, content=b'{"queue": "emails", "type": "t"'),
    # --- type confusion (strict mode) ----------------------------------------------------------
    Hostile("lease-seconds-as-string", "POST", "/v1/claim", 422, json=_claim(lease_seconds="30")),
    Hostile("priority-as-string", "POST", "/v1/jobs", 422, json=_enqueue(priority="1")),
    Hostile("max-jobs-as-float", "POST", "/v1/claim", 422, json=_claim(max_jobs=1.5)),
    Hostile("max-jobs-as-bool", "POST", "/v1/claim", 422, json=_claim(max_jobs=True)),
    Hostile(
        "retryable-as-string",
        "POST",
        "/v1/fail",
        422,
        json=lambda s: {"worker_id": "w", "leases": [s.lease(retryable="false")]},
    ),
    Hostile(
        "job-id-as-string",
        "POST",
        "/v1/complete",
        422,
        json=lambda s: {"worker_id": "w", "leases": [{**s.lease(), "job_id": str(s.leased["id"])}]},
    ),
    Hostile("run-at-naive", "POST", "/v1/jobs", 422, json=_enqueue(run_at="2030-01-01T00:00:00")),
    Hostile("run-at-as-number", "POST", "/v1/jobs", 422, json=_enqueue(run_at=1893456000)),
    # --- out of range -----------------------------------------------------------------------------
    Hostile("priority-2-pow-31", "POST", "/v1/jobs", 422, json=_enqueue(priority=2**31)),
    Hostile(
        "priority-20-digits",
        "POST",
        "/v1/jobs",
        422,
        content=_json_bytes('{"queue": "emails", "type": "t", "priority": 99999999999999999999}'),
    ),
    Hostile("max-attempts-0", "POST", "/v1/jobs", 422, json=_enqueue(max_attempts=0)),
    Hostile("lease-seconds-negative", "POST", "/v1/claim", 422, json=_claim(lease_seconds=-1)),
    Hostile("wait-seconds-1e9", "POST", "/v1/claim", 422, json=_claim(wait_seconds=1e9)),
    Hostile("delay-seconds-negative", "POST", "/v1/jobs", 422, json=_enqueue(delay_seconds=-1)),
    Hostile(
        "release-delay-1e9",
        "POST",
        "/v1/release",
        422,
        json=lambda s: {"worker_id": "w", "leases": [s.lease(delay_seconds=1e9)]},
    ),
    # --- names ----------------------------------------------------------------------------------
    Hostile(
        "sql-in-queue-name",
        "POST",
        "/v1/jobs",
        422,
        json=_enqueue(queue="emails'; DROP TABLE jobs;--"),
    ),
    Hostile(
        "sql-in-claim-queues",
        "POST",
        "/v1/claim",
        422,
        json=_claim(queues=["emails", "emails'; DROP TABLE jobs;--"]),
    ),
    Hostile(
        "sql-in-path-queue-name",
        "POST",
        "/v1/queues/emails%27%3B%20DROP%20TABLE%20jobs%3B--/pause",
        422,
    ),
    Hostile(
        "sql-in-listing-queue", "GET", "/v1/jobs?queue=emails%27%3B%20DROP%20TABLE%20jobs%3B--", 422
    ),
    Hostile("newline-in-queue-name", "POST", "/v1/jobs", 422, json=_enqueue(queue="a\nb")),
    Hostile("newline-in-path-queue-name", "POST", "/v1/queues/a%0Ab/pause", 422),
    Hostile("queue-name-10000-chars", "POST", "/v1/jobs", 422, json=_enqueue(queue="q" * 10_000)),
    Hostile("type-10000-chars", "POST", "/v1/jobs", 422, json=_enqueue(type="t" * 10_000)),
    Hostile("worker-id-10000-chars", "POST", "/v1/claim", 422, json=_claim(worker_id="w" * 10_000)),
    Hostile(
        "idempotency-key-10000-chars",
        "POST",
        "/v1/jobs",
        422,
        json=_enqueue(),
        headers={"Idempotency-Key": "k" * 10_000},
    ),
    # --- unknown fields, content types ------------------------------------------------------------
    Hostile("unknown-field", "POST", "/v1/jobs", 422, json=_enqueue(surprise=1)),
    Hostile(
        "unknown-field-in-lease",
        "POST",
        "/v1/complete",
        422,
        json=lambda s: {"worker_id": "w", "leases": [s.lease(status="succeeded")]},
    ),
    Hostile(
        "text-plain-body",
        "POST",
        "/v1/jobs",
        415,
        content=b'{"queue": "emails", "type": "t"}',
        content_type="text/plain",
    ),
    Hostile(
        "form-body-to-claim",
        "POST",
        "/v1/claim",
        415,
        content=b"worker_id=w&queues=emails",
        content_type="application/x-www-form-urlencoded",
    ),
    Hostile(
        "text-plain-to-a-route-without-body",
        "POST",
        "/v1/queues/emails/pause",
        415,
        content=b"pause",
        content_type="text/plain",
    ),
    # --- ids and paths --------------------------------------------------------------------------
    Hostile("job-id-20-digits", "GET", "/v1/jobs/99999999999999999999", 404),
    Hostile("job-id-20-digits-cancel", "POST", "/v1/jobs/99999999999999999999/cancel", 404),
    Hostile("job-id-negative", "GET", "/v1/jobs/-1", 404),
    Hostile("job-id-negative-retry", "POST", "/v1/jobs/-1/retry", 404),
    Hostile("job-id-not-a-number", "GET", "/v1/jobs/abc", 422),
    Hostile("job-id-not-a-number-cancel", "POST", "/v1/jobs/abc/cancel", 422),
    Hostile("path-traversal-job", "GET", "/v1/jobs/..%2F..%2Fetc%2Fpasswd", 404),
    Hostile("path-traversal-queue", "POST", "/v1/queues/..%2Fx/pause", 404),
    Hostile("malformed-cursor", "GET", "/v1/jobs?after=..%2F..%2Fetc%2Fpasswd", 422),
    Hostile("listing-limit-huge", "GET", "/v1/jobs?limit=99999999999999999999", 422),
    Hostile("unknown-status-filter", "GET", "/v1/jobs?status=running%27--", 422),
    Hostile("retry-a-pending-job", "POST", "/v1/jobs/{pending}/retry", 409),
    Hostile("method-not-allowed", "DELETE", "/v1/jobs/{pending}", 405),
    # --- idempotency ------------------------------------------------------------------------------
    Hostile(
        "idempotency-key-reused-with-other-body",
        "POST",
        "/v1/jobs",
        422,
        json=_enqueue(idempotency_key=SEED_IDEMPOTENCY_KEY, payload={"other": True}),
    ),
    Hostile(
        "idempotency-header-reused-with-other-body",
        "POST",
        "/v1/jobs",
        422,
        json=_enqueue(priority=5),
        headers={"Idempotency-Key": SEED_IDEMPOTENCY_KEY},
    ),
    Hostile(
        "idempotency-header-and-field-differ",
        "POST",
        "/v1/jobs",
        422,
        json=_enqueue(idempotency_key="a"),
        headers={"Idempotency-Key": "b"},
    ),
    Hostile(
        "idempotency-header-on-batch",
        "POST",
        "/v1/jobs/batch",
        422,
        json={"jobs": [_enqueue()]},
        headers={"Idempotency-Key": "k"},
    ),
    # --- all or nothing: a good item next to a bad one changes nothing -----------------------------
    Hostile(
        "batch-good-then-bad",
        "POST",
        "/v1/jobs/batch",
        422,
        json={"jobs": [_enqueue(), _enqueue(queue="bad queue")]},
    ),
    Hostile(
        "claim-good-queue-then-bad",
        "POST",
        "/v1/claim",
        422,
        json=_claim(queues=["emails", "-bad"]),
    ),
    Hostile(
        "heartbeat-good-lease-then-bad",
        "POST",
        "/v1/heartbeat",
        422,
        json=lambda s: {
            "worker_id": "w",
            "leases": [s.lease(lease_seconds=3600), {"job_id": 1, "lease_id": "nope"}],
        },
    ),
    Hostile(
        "complete-good-lease-then-bad",
        "POST",
        "/v1/complete",
        422,
        json=lambda s: {"worker_id": "w", "leases": [s.lease(), {**s.lease(), "job_id": 0}]},
    ),
    # --- authentication ---------------------------------------------------------------------------
    Hostile("no-authorization", "POST", "/v1/jobs", 401, json=_enqueue(), key=None),
    Hostile(
        "bearer-without-token", "POST", "/v1/jobs", 401, json=_enqueue(), authorization="Bearer"
    ),
    Hostile(
        "bearer-blank-token", "POST", "/v1/jobs", 401, json=_enqueue(), authorization="Bearer    "
    ),
    Hostile("basic-scheme", "POST", "/v1/jobs", 401, json=_enqueue(), authorization="Basic xxx"),
    Hostile(
        "bearer-short-token",
        "POST",
        "/v1/jobs",
        401,
        json=_enqueue(),
        authorization="Bearer jobq_1_short",
    ),
    Hostile(
        "admin-secret-under-wrong-scheme",
        "POST",
        "/v1/jobs",
        401,
        json=_enqueue(),
        authorization="Token {admin}",
    ),
    Hostile(
        "admin-secret-with-a-suffix",
        "POST",
        "/v1/jobs",
        401,
        json=_enqueue(),
        authorization="Bearer {admin}x",
    ),
    Hostile(
        "revoked-key",
        "POST",
        "/v1/jobs",
        401,
        json=_enqueue(),
        key="producer",
        setup=_revoke_producer,
    ),
    Hostile("no-authorization-on-a-read", "GET", "/v1/jobs/{pending}", 401, key=None),
    # --- authorisation ----------------------------------------------------------------------------
    Hostile("producer-key-on-claim", "POST", "/v1/claim", 403, json=_claim(), key="producer"),
    Hostile("worker-key-on-cancel", "POST", "/v1/jobs/{pending}/cancel", 403, key="worker"),
    Hostile(
        "scoped-key-on-another-queue",
        "POST",
        "/v1/jobs",
        403,
        json=_enqueue(),
        key="scoped_producer",
    ),
    Hostile(
        "scoped-key-batch-with-one-other-queue",
        "POST",
        "/v1/jobs/batch",
        403,
        json={"jobs": [_enqueue(queue="billing.a"), _enqueue()]},
        key="scoped_producer",
    ),
    Hostile(
        "scoped-worker-claims-another-queue",
        "POST",
        "/v1/claim",
        403,
        json=_claim(queues=["billing.a", "emails"]),
        key="scoped_worker",
    ),
    Hostile(
        "scoped-admin-pauses-another-queue",
        "POST",
        "/v1/queues/emails/pause",
        403,
        key="scoped_admin",
    ),
    Hostile(
        "scoped-admin-cancels-another-queues-job",
        "POST",
        "/v1/jobs/{pending}/cancel",
        403,
        key="scoped_admin",
    ),
]


async def _seed(admin: httpx.AsyncClient) -> Seed:
    """A pending job enqueued with an idempotency key, and a job leased to worker "w"."""
    r = await admin.post("/v1/jobs", json=_enqueue(idempotency_key=SEED_IDEMPOTENCY_KEY))
    assert r.status_code == 201, r.text
    pending = r.json()
    r = await admin.post("/v1/jobs", json={"queue": "work", "type": "t"})
    assert r.status_code == 201, r.text
    r = await admin.post("/v1/claim", json={"worker_id": "w", "queues": ["work"]})
    assert r.status_code == 200, r.text
    [leased] = r.json()["jobs"]
    r = await admin.put("/v1/queues/paused-q")
    assert r.status_code == 201, r.text
    r = await admin.post("/v1/queues/paused-q/pause")
    assert r.status_code == 200, r.text
    return Seed(pending=pending, leased=leased)


SNAPSHOT = {
    "jobs": "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.id), '')) FROM jobs t",
    "queues": "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.name), '')) FROM queues t",
    "api_keys": "SELECT md5(coalesce(string_agg(t::text, '|' ORDER BY t.id), '')) FROM api_keys t",
    "queue_counts": (
        "SELECT coalesce(string_agg(c, '|' ORDER BY c), '') FROM ("
        "SELECT queue || ':' || status || '=' || sum(jobs) AS c FROM queue_counts "
        "GROUP BY queue, status HAVING sum(jobs) <> 0) s"
    ),
    "job_rows": "SELECT count(*)::text || ' ' || coalesce(max(updated_at)::text, '') FROM jobs",
}


async def _snapshot(engine: AsyncEngine) -> dict[str, str]:
    async with engine.connect() as conn:
        return {
            name: (await conn.execute(text(sql))).scalar_one() for name, sql in SNAPSHOT.items()
        }


async def _chunks(body: bytes) -> AsyncIterator[bytes]:
    for start in range(0, len(body), 8192):
        yield body[start : start + 8192]


def _send_kwargs(case: Hostile, seed: Seed) -> dict[str, Any]:
    headers = dict(case.headers)
    kwargs: dict[str, Any] = {}
    if case.content is not None:
        raw = case.content(seed) if callable(case.content) else case.content
        kwargs["content"] = _chunks(raw) if case.stream else raw
        if case.content_type is not None:
            headers["content-type"] = case.content_type
    elif case.json is not None:
        kwargs["json"] = case.json(seed) if callable(case.json) else case.json
    kwargs["headers"] = headers
    return kwargs


def _assert_clean(
    case: Hostile, response: httpx.Response, secrets: list[str], sent: str | None
) -> None:
    body = response.text
    shown = body + "\n" + "\n".join(f"{k}: {v}" for k, v in response.headers.items())
    for needle in TRACES + SQL:
        assert needle not in body, f"{case.id}: answer shows {needle!r}: {body[:500]}"
    for needle in DRIVER:
        assert needle not in body.lower(), f"{case.id}: answer shows {needle!r}: {body[:500]}"
    for secret in secrets:
        assert secret not in shown, f"{case.id}: answer shows a key's secret"
    token = (sent or "").partition(" ")[2].strip()
    if sent is not None and len(token) >= 8:  # a bare "Bearer" is a word the 401 itself uses
        assert sent not in shown, f"{case.id}: answer echoes the Authorization header"
        assert token not in shown, f"{case.id}: answer echoes the token sent"


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
async def test_hostile_request_is_refused_cleanly_and_changes_nothing(
    app: FastAPI,
    client: httpx.AsyncClient,
    keys: Keys,
    clean_db: AsyncEngine,
    caplog: pytest.LogCaptureFixture,
    case: Hostile,
) -> None:
    caplog.set_level(logging.ERROR)
    async with as_key(client, keys.admin) as admin:
        seed = await _seed(admin)
    if case.setup is not None:
        await case.setup(app, clean_db)
    before = await _snapshot(clean_db)

    sent: str | None = None
    if case.authorization is not None:
        sent = case.authorization.format(admin=keys.admin)
        caller = as_key(client, None)
        caller.headers["Authorization"] = sent
    else:
        secret = keys.by_role(case.key) if case.key is not None else None
        caller = as_key(client, secret)
    async with caller:
        response = await caller.request(
            case.method, seed.fill(case.path), **_send_kwargs(case, seed)
        )

    if case.stream:  # the row is about a body of unknown length
        assert "content-length" not in response.request.headers
        assert response.request.headers["transfer-encoding"] == "chunked"
    assert response.status_code < 500, f"{case.id}: {response.status_code} {response.text[:500]}"
    assert response.status_code == case.status, (
        f"{case.id}: expected {case.status}, got {response.status_code}: {response.text[:500]}"
    )
    media = response.headers.get("content-type", "").split(";")[0].strip()
    assert media == "application/problem+json", f"{case.id}: content type {media!r}"
    problem = response.json()
    assert problem["status"] == case.status and problem["title"], problem
    if case.status == 401:
        assert response.headers["www-authenticate"].startswith("Bearer")
    _assert_clean(case, response, list(dataclasses.astuple(keys)), sent)
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert not errors, f"{case.id}: the server logged {errors[0].getMessage()!r}"
    assert await _snapshot(clean_db) == before, (
        f"{case.id}: the rejected request changed the database"
    )


def test_the_table_covers_the_issue() -> None:
    assert len(CASES) >= 30
    assert len({c.id for c in CASES}) == len(CASES), "row ids must be unique"
    assert all(400 <= c.status < 500 for c in CASES)
