"""Input that could be read two ways is refused, naming the field, before anything is written.

Repeated keys (parsers disagree on which one counts), values of the wrong JSON type (``"30"``
for a number, ``1`` for a flag), instants without an offset and bodies that are not JSON.
"""

from __future__ import annotations

import json
import random
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.exceptions import RequestValidationError
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine

from app.http.strict_json import parse_strict_json
from tests.api.helpers import claim, enqueue, get_job

JSON = {"content-type": "application/json"}
Lease = dict[str, Any]
Body = Callable[[Lease], bytes | dict[str, Any]]


@pytest.fixture
async def held(client: httpx.AsyncClient) -> AsyncIterator[Lease]:
    """One job, claimed: the lease the lease-call cases name (so a refusal that wrote would show)."""
    await enqueue(client)
    [job] = await claim(client, worker="w")
    yield {"job_id": job["id"], "lease_id": job["lease_id"]}


async def _snapshot(client: httpx.AsyncClient, engine: AsyncEngine, lease: Lease) -> object:
    async with engine.connect() as conn:
        count = (await conn.execute(text("SELECT count(*) FROM jobs"))).scalar_one()
    return count, await get_job(client, lease["job_id"])


def _problem(response: httpx.Response, status: int) -> dict[str, Any]:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/problem+json")
    problem: dict[str, Any] = response.json()
    assert problem["status"] == status
    return problem


def _fail(**fields: Any) -> Body:
    return lambda lease: {"worker_id": "w", "leases": [{**lease, **fields}]}


def _enqueue(**fields: Any) -> Body:
    return lambda _: {"type": "t", **fields}


NAIVE = "2030-01-01T00:00:00"

# case, path, body (raw bytes or a value sent as JSON), the field the 422 names
REFUSED: list[tuple[str, str, Body, str]] = [
    (
        "repeated key at top level",
        "/v1/jobs",
        lambda _: b'{"type": "a", "queue": "q", "type": "b"}',
        "body.type",
    ),
    (
        "repeated key nested in payload",
        "/v1/jobs",
        lambda _: b'{"type": "t", "payload": {"user": 1, "x": {"a": 1, "b": [], "a": 2}}}',
        "body.payload.x.a",
    ),
    (
        "repeated key in a batch item",
        "/v1/jobs/batch",
        lambda _: (
            b'{"jobs": [{"type": "t"}, {"type": "t"}, {"type": "t"}, '
            b'{"queue": "a", "type": "t", "queue": "b"}]}'
        ),
        "body.jobs[3].queue",
    ),
    (
        "repeated key spelt with an escape",
        "/v1/jobs",
        lambda _: b'{"type": "t", "\\u0074ype": "u"}',
        "body.type",
    ),
    (
        "repeated key after an escaped quote and colon in a string",
        "/v1/jobs",
        lambda _: b'{"type": "t", "payload": {"s": "x\\": y", "s": 1}}',
        "body.payload.s",
    ),
    (
        "repeated key beside a 20-digit integer (Python's parser)",
        "/v1/jobs",
        lambda _: b'{"type": "t", "payload": {"n": 12345678901234567890, "n": 1}}',
        "body.payload.n",
    ),
    (
        "repeated key in a lease item",
        "/v1/complete",
        lambda lease: (
            json.dumps({"worker_id": "w", "leases": [{**lease, "result": 1}]})
            .replace('"result": 1', '"result": 1, "result": 2')
            .encode()
        ),
        "body.leases[0].result",
    ),
    ("string for integer", "/v1/jobs", _enqueue(lease_seconds="30"), "body.lease_seconds"),
    ("string for priority", "/v1/jobs", _enqueue(priority="5"), "body.priority"),
    ("float for integer", "/v1/jobs", _enqueue(priority=1.0), "body.priority"),
    ("float for max_attempts", "/v1/jobs", _enqueue(max_attempts=3.0), "body.max_attempts"),
    ("bool for integer", "/v1/jobs", _enqueue(max_attempts=True), "body.max_attempts"),
    ("string for float", "/v1/jobs", _enqueue(delay_seconds="5"), "body.delay_seconds"),
    ("bool for float", "/v1/jobs", _enqueue(delay_seconds=False), "body.delay_seconds"),
    ("number for string", "/v1/jobs", lambda _: {"type": 5}, "body.type"),
    ("number for queue", "/v1/jobs", _enqueue(queue=7), "body.queue"),
    (
        "number for worker_id",
        "/v1/claim",
        lambda _: {"worker_id": 12, "queues": ["default"]},
        "body.worker_id",
    ),
    (
        "float for max_jobs",
        "/v1/claim",
        lambda _: {"worker_id": "w", "queues": ["default"], "max_jobs": 2.0},
        "body.max_jobs",
    ),
    (
        "string for wait_seconds",
        "/v1/claim",
        lambda _: {"worker_id": "w", "queues": ["default"], "wait_seconds": "1"},
        "body.wait_seconds",
    ),
    ("string for bool", "/v1/fail", _fail(retryable="true"), "body.leases[0].retryable"),
    ("integer for bool", "/v1/fail", _fail(retryable=1), "body.leases[0].retryable"),
    (
        "string for retry_after_seconds",
        "/v1/fail",
        _fail(retry_after_seconds="60"),
        "body.leases[0].retry_after_seconds",
    ),
    ("number for error text", "/v1/fail", _fail(error=451), "body.leases[0].error"),
    (
        "string for job_id",
        "/v1/complete",
        lambda lease: {"worker_id": "w", "leases": [{**lease, "job_id": str(lease["job_id"])}]},
        "body.leases[0].job_id",
    ),
    (
        "number for lease_id",
        "/v1/heartbeat",
        lambda lease: {"worker_id": "w", "leases": [{**lease, "lease_id": 5}]},
        "body.leases[0].lease_id",
    ),
    (
        "string for lease_seconds in a heartbeat",
        "/v1/heartbeat",
        lambda lease: {"worker_id": "w", "leases": [{**lease, "lease_seconds": "30"}]},
        "body.leases[0].lease_seconds",
    ),
    (
        "string for a release delay",
        "/v1/release",
        lambda lease: {"worker_id": "w", "leases": [{**lease, "delay_seconds": "0"}]},
        "body.leases[0].delay_seconds",
    ),
    ("naive run_at", "/v1/jobs", _enqueue(run_at=NAIVE), "body.run_at"),
    (
        "naive run_at in a batch",
        "/v1/jobs/batch",
        lambda _: {"jobs": [{"type": "t"}, {"type": "t", "run_at": NAIVE}]},
        "body.jobs[1].run_at",
    ),
    ("date without time for run_at", "/v1/jobs", _enqueue(run_at="2030-01-01"), "body.run_at"),
    ("Unix time for run_at", "/v1/jobs", _enqueue(run_at=1_900_000_000), "body.run_at"),
    ("Unix time as text for run_at", "/v1/jobs", _enqueue(run_at="1900000000"), "body.run_at"),
]


@pytest.mark.parametrize(
    ("path", "body", "field"), [c[1:] for c in REFUSED], ids=[c[0] for c in REFUSED]
)
async def test_ambiguous_input_is_422_naming_the_field_and_writes_nothing(
    client: httpx.AsyncClient,
    clean_db: AsyncEngine,
    held: Lease,
    path: str,
    body: Body,
    field: str,
) -> None:
    before = await _snapshot(client, clean_db, held)
    sent = body(held)
    if isinstance(sent, bytes):
        r = await client.post(path, content=sent, headers=JSON)
    else:
        r = await client.post(path, json=sent)
    problem = _problem(r, 422)
    assert problem["type"].endswith("/validation-error")
    assert [e["field"] for e in problem["errors"]] == [field], problem
    assert field in problem["detail"]
    assert await _snapshot(client, clean_db, held) == before


async def test_escaped_quotes_colons_and_nested_keys_are_not_repeats(
    client: httpx.AsyncClient,
) -> None:
    # A key with an escaped quote, one ending in a backslash, the same name at other levels,
    # colons and escaped quotes inside values: all distinct keys.
    raw = (
        b'{"type": "t", "payload": {"a\\"b": 1, "a": 2, "a\\\\": 3, "ab": {"a": {"a": 4}}, '
        b'"url": "http://h:80/x", "said": "he: \\"hi\\" : there", "\\":": ":", "list": '
        b'[{"a": 1}, {"a": 2}]}}'
    )
    r = await client.post("/v1/jobs", content=raw, headers=JSON)
    assert r.status_code == 201, r.text
    assert r.json()["payload"] == {
        'a"b': 1,
        "a": 2,
        "a\\": 3,
        "ab": {"a": {"a": 4}},
        "url": "http://h:80/x",
        "said": 'he: "hi" : there',
        '":': ":",
        "list": [{"a": 1}, {"a": 2}],
    }


async def test_json_types_that_fit_are_taken(client: httpx.AsyncClient) -> None:
    # Float fields take JSON integers; an instant with an offset is taken (and shown in UTC).
    job = await enqueue(client, delay_seconds=0, priority=-3, max_attempts=2)
    assert job["status"] == "pending" and job["priority"] == -3
    assert (await enqueue(client, delay_seconds=5))["status"] == "scheduled"
    later = await enqueue(client, run_at="2030-01-01T10:00:00+05:00")
    assert datetime.fromisoformat(later["run_at"]) == datetime(2030, 1, 1, 5, tzinfo=UTC)
    [claimed] = await claim(client, worker="w", wait_seconds=0, lease_seconds=30)
    r = await client.post(
        "/v1/fail",
        json={
            "worker_id": "w",
            "leases": [
                {
                    "job_id": claimed["id"],
                    "lease_id": claimed["lease_id"],
                    "retryable": False,
                    "retry_after_seconds": 0,
                }
            ],
        },
    )
    assert r.status_code == 200 and r.json()["results"][0]["status"] == "dead"


async def test_offset_run_at_with_an_idempotency_key_replays(client: httpx.AsyncClient) -> None:
    # The fingerprint hashes run_at as sent: the same request again is a replay, another offset
    # for the same instant is another request.
    body = {"type": "t", "run_at": "2030-01-01T10:00:00+05:00", "idempotency_key": "k"}
    first = await client.post("/v1/jobs", json=body)
    again = await client.post("/v1/jobs", json=body)
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    other = await client.post("/v1/jobs", json={**body, "run_at": "2030-01-01T05:00:00Z"})
    assert _problem(other, 422)["type"].endswith("/idempotency-key-reused")


@pytest.mark.parametrize(
    ("path", "content_type", "raw"),
    [
        ("/v1/jobs", "text/plain", b'{"type": "t"}'),
        ("/v1/jobs", "application/x-www-form-urlencoded", b"type=t"),
        ("/v1/jobs", "text/plain; charset=utf-8", b""),  # the route takes a body
        ("/v1/jobs/batch", "multipart/form-data; boundary=x", b"--x--"),
        ("/v1/claim", "text/json", b'{"worker_id": "w", "queues": ["default"]}'),
        ("/v1/complete", "application/octet-stream", b"\x00"),
    ],
)
async def test_a_body_that_is_not_json_is_415(
    client: httpx.AsyncClient,
    clean_db: AsyncEngine,
    held: Lease,
    path: str,
    content_type: str,
    raw: bytes,
) -> None:
    before = await _snapshot(client, clean_db, held)
    r = await client.post(path, content=raw, headers={"content-type": content_type})
    problem = _problem(r, 415)
    assert problem["type"].endswith("/unsupported-media-type")
    assert problem["title"] == "Unsupported Media Type"
    media = content_type.split(";")[0]
    assert media in problem["detail"]
    assert "application/json" in problem["detail"] and "application/*+json" in problem["detail"]
    assert r.headers["accept"] == "application/json"
    assert await _snapshot(client, clean_db, held) == before


async def test_a_body_on_a_route_without_one_must_still_be_json(
    client: httpx.AsyncClient, held: Lease
) -> None:
    url = f"/v1/jobs/{held['job_id']}/cancel"
    r = await client.post(url, content=b"now", headers={"content-type": "text/plain"})
    _problem(r, 415)
    assert (await get_job(client, held["job_id"]))["status"] == "running"
    # Without a body the header does not matter, on GET and POST alike.
    r = await client.get("/v1/jobs", headers={"content-type": "text/plain"})
    assert r.status_code == 200 and len(r.json()["jobs"]) == 1
    r = await client.post(url, headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["status"] == "cancelled"


@pytest.mark.parametrize(
    "headers",
    [
        {"content-type": "application/merge-patch+json"},
        {"content-type": "application/vnd.jobq.v1+json; charset=utf-8"},
        {"content-type": "Application/JSON"},
        {},
    ],
    ids=["+json", "vendor +json with parameter", "capitals", "no content type"],
)
async def test_json_content_types_and_none_are_taken(
    client: httpx.AsyncClient, headers: dict[str, str]
) -> None:
    r = await client.post("/v1/jobs", content=b'{"type": "t", "payload": [1]}', headers=headers)
    assert r.status_code == 201, r.text
    assert ("content-type" in r.request.headers) == bool(headers)
    assert r.json()["payload"] == [1]


async def test_openapi_declares_415_on_routes_with_a_body(app: FastAPI) -> None:
    paths = app.openapi()["paths"]
    for path in ("/v1/jobs", "/v1/jobs/batch", "/v1/claim", "/v1/heartbeat", "/v1/fail"):
        responses = paths[path]["post"]["responses"]
        assert "application/problem+json" in responses["415"]["content"], path
    assert "415" not in paths["/v1/jobs"]["get"]["responses"]
    assert "415" not in paths["/v1/jobs/{job_id}/cancel"]["post"]["responses"]


def _random_body(rng: random.Random) -> tuple[bytes, bool]:
    """A JSON text with awkward keys and spacing, and whether some object in it repeats a key."""
    letters = ["a", "b", ":", '"', "\\", " ", "é", "{", ","]
    spaces = ["", " ", "\n", "\t "]
    repeats = False

    def string(value: str) -> str:
        # Sometimes spelt with \u escapes, so one key can be written two ways.
        return (
            '"'
            + "".join(
                f"\\u{ord(c):04x}"
                if c.isascii() and c.isalpha() and rng.random() < 0.2
                else json.dumps(c)[1:-1]
                for c in value
            )
            + '"'
        )

    def value(depth: int) -> str:
        nonlocal repeats
        roll = rng.random()
        if depth > 3 or roll < 0.3:
            word = "".join(rng.choices(letters, k=rng.randint(0, 3)))
            return rng.choice(["1", "12345678901234567890", "true", "null", string(word)])
        if roll < 0.5:
            return "[" + ",".join(value(depth + 1) for _ in range(rng.randint(0, 3))) + "]"
        keys = list(
            dict.fromkeys("".join(rng.choices(letters, k=rng.randint(0, 2))) for _ in "xyz")
        )
        if keys and rng.random() < 0.15:
            keys.insert(rng.randrange(len(keys) + 1), rng.choice(keys))
            repeats = True
        return (
            "{"
            + ",".join(
                f"{rng.choice(spaces)}{string(k)}{rng.choice(spaces)}:{rng.choice(spaces)}"
                + value(depth + 1)
                for k in keys
            )
            + "}"
        )

    return value(0).encode(), repeats


def test_repeated_keys_are_found_exactly_in_generated_bodies() -> None:
    # The cheap counts on the fast path must never miss a repeat, nor invent one.
    rng = random.Random(20261201)
    seen_repeats = 0
    for _ in range(3000):
        raw, repeats = _random_body(rng)
        try:
            parse_strict_json(raw, max_depth=64)
            found = False
        except RequestValidationError as exc:
            found = exc.errors()[0]["msg"].startswith("duplicate key")
        assert found == repeats, raw
        seen_repeats += repeats
    assert seen_repeats > 100


def test_a_repeated_key_is_located_by_its_path() -> None:
    with pytest.raises(RequestValidationError) as info:
        parse_strict_json(b'[0, {"a": {"x": 1, "y": {"z": 1, "z": 2}}}]', max_depth=8)
    assert info.value.errors()[0]["loc"] == ("body", 1, "a", "y", "z")
    assert parse_strict_json(b'{"x": "\\"", "y": 1}', max_depth=8) == {"x": '"', "y": 1}
