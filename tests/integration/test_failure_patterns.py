"""``jobq_failure_pattern`` (migration 0027): the message a failure without a traceback
fingerprint is grouped by, with quoted values, query strings, e-mail addresses and every token
holding a digit masked.

Issue 40, item 10: ``jobq_mask_message`` masked numbers standing as words only, so ids glued to
letters or punctuation (``ch_3c40a657f12715``, ``<u8996@example.com>``) made a group per job.
"""

from __future__ import annotations

import pytest
from sqlalchemy import text
from sqlalchemy.ext.asyncio import AsyncEngine


async def _patterns(engine: AsyncEngine, *messages: str) -> list[str]:
    async with engine.connect() as conn:
        rows = await conn.execute(
            text("SELECT jobq_failure_pattern(m) FROM unnest(CAST(:ms AS text[])) AS t(m)"),
            {"ms": list(messages)},
        )
        return [row[0] for row in rows]


@pytest.mark.parametrize(
    ("message", "pattern"),
    [
        (
            "Charge ch_3c40a657f12715 declined for customer cus_1a2b3c4d5e: insufficient_funds "
            "(request req_8f3a9c2e112233)",
            "Charge <id> declined for customer <id>: insufficient_funds (request <id>)",
        ),
        (
            "{'u8996@example.com': (550, b'5.1.1 <u8996@example.com>: Recipient address "
            "rejected: User unknown in virtual mailbox table')}",
            "{'?': (<n>, b'<n> <<email>>: Recipient address rejected: User unknown in virtual "
            "mailbox table')}",
        ),
        (
            "SMTP 451 4.7.1 <ada@example.com>: greylisted, try again in 300 seconds.",
            "SMTP <n> <n> <<email>>: greylisted, try again in <n> seconds.",
        ),
        ("'user_8812'", "'?'"),
        (
            'duplicate key value violates unique constraint "orders_pkey"\n'
            "DETAIL:  Key (id)=(42) already exists.",
            'duplicate key value violates unique constraint "?"\n'
            "DETAIL:  Key (id)=(<n>) already exists.",
        ),
        (
            "503 Service Unavailable for url "
            "https://api.x.com/v1/charges?id=ch_3c40a657f12715&expand=customer",
            "<n> Service Unavailable for url https://api.x.com/<id>/charges?<query>",
        ),
        (
            "Server error '503 Service Unavailable' for url 'https://api.x.com/v1/charges?id=1'",
            "Server error '?' for url '?'",
        ),
        (
            "open /var/data/exports/u8812/report-2026-12-07.csv: no such file or directory",
            "open /var/data/exports/<id>/<id>: no such file or directory",
        ),
        (
            "[Errno 2] No such file or directory: '/data/in/8812.csv'",
            "[Errno <n>] No such file or directory: '?'",
        ),
        ("connect ECONNREFUSED 127.0.0.1:6379", "connect ECONNREFUSED <n>:<n>"),
        (
            "dial tcp 10.0.3.7:5432: connect: connection refused",
            "dial tcp <n>:<n>: connect: connection refused",
        ),
        (
            "upstream timeout after 30.2s (request req_8f3a9c2e)",
            "upstream timeout after <id> (request <id>)",
        ),
        ("upload 1b4e28ba-2fa1-11d2-883f-0016d3cca427 failed", "upload <id> failed"),
        ("object at 0x7f3a9c2b1d90 gone", "object at <id> gone"),
        # An apostrophe quotes nothing; a sentence's full stop stays after a number.
        (
            "can't find 'x' and won't retry attempt 3.",
            "can't find '?' and won't retry attempt <n>.",
        ),
        ("run `make 7` first", "run `?` first"),
        ("lease expired", "lease expired"),
    ],
)
async def test_realistic_messages_keep_their_words_and_lose_their_values(
    engine: AsyncEngine, message: str, pattern: str
) -> None:
    assert await _patterns(engine, message) == [pattern]


@pytest.mark.parametrize(
    "same",
    [
        (
            "Charge ch_3c40a657f12715 declined",
            "Charge ch_3c9e11aa02b3ff declined",
        ),
        ("mailbox <u8996@example.com> unknown", "mailbox <ada.lovelace@example.org> unknown"),
        (
            "GET https://api.x.com/v1/users?name=alice failed",
            "GET https://api.x.com/v1/users?name=bob&page=2 failed",
        ),
        ("KeyError: 'user_8812'", "KeyError: 'user_17'"),
        (
            "dial tcp 10.0.3.7:5432: connect: connection refused",
            "dial tcp 192.168.12.201:6432: connect: connection refused",
        ),
    ],
)
async def test_one_cause_with_other_values_is_one_pattern(
    engine: AsyncEngine, same: tuple[str, str]
) -> None:
    first, second = await _patterns(engine, *same)
    assert first == second


@pytest.mark.parametrize(
    "different",
    [
        ("SMTP 451 greylisted", "SMTP 550 no such user"),
        ("connect ECONNREFUSED 127.0.0.1:6379", "connect ETIMEDOUT 127.0.0.1:6379"),
        ("GET https://api.x.com/v1/users failed", "GET https://api.y.com/v1/users failed"),
    ],
)
async def test_other_words_are_other_patterns(
    engine: AsyncEngine, different: tuple[str, str]
) -> None:
    first, second = await _patterns(engine, *different)
    assert first != second
