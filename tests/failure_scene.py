"""A realistic failure scene (issue 40, item 10): twelve causes from Python, TypeScript and Go
workers, each failing many jobs with ids, addresses, paths and hosts of their own, from two
hosts (other install paths) and three releases (other line numbers).

Grouped by queue, type, error type and the message with only whole-word numbers masked
(``jobq_mask_message``), this scene made 233 groups, 225 of them of one job (a payment id, a
mailbox, a duplicate key per job); grouped as error trackers do, it makes one group per cause. Causes 3 and 4 raise the same ``KeyError``
with the same messages in the same queue and job type from two code paths, and causes 10 and 11
the same message from the same frames as two exception types: four groups, never two.

``tests/api/test_failures.py`` and ``tests/api/test_dashboard_failures.py`` fail the scene's
jobs through the API; ``tests/unit/test_fingerprints.py`` reads its tracebacks.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

JOBS_PER_CAUSE = 75  # twelve causes: 900 jobs
FAIL_CALL_LEASES = 25


def _hex(n: int, width: int) -> str:
    """A job's own id-like hex string: differs per job, as payment and request ids do."""
    return f"{(n + 1) * 2654435761 % 16**width:0{width}x}"


def _site(n: int) -> str:
    """The site-packages of the job's host: two hosts installed in two places."""
    return (
        "/srv/app/.venv/lib/python3.12/site-packages"
        if n % 2
        else "/opt/venvs/billing-20261201/lib/python3.11/site-packages"
    )


def _app(n: int) -> str:
    """The application's folder on the job's host (a release folder on one of them)."""
    return "/srv/app" if n % 2 else "/home/deploy/releases/20261203T101500/app"


def _line(n: int, line: int) -> int:
    """A frame's line in the release that ran the job: three releases moved lines around."""
    return line + 3 * (n % 3)


def python_traceback(n: int, frames: list[tuple[str, int, str, str]], last: str) -> str:
    """A Python traceback as ``traceback.format_exception`` writes it, outermost frame first:
    each frame (file, line, function, source line), then the exception line."""
    lines = ["Traceback (most recent call last):"]
    lines.append(
        f'  File "{_site(n)}/jobq_client/worker.py", line 517, in _call\n    return await handler(ctx)'
    )
    for file, line, function, source in frames:
        lines.append(f'  File "{file}", line {_line(n, line)}, in {function}\n    {source}')
    return "\n".join(lines) + f"\n{last}\n"


def card_declined(n: int) -> dict[str, Any]:
    """Cause 1 (Python): a card declined, with the charge's, customer's and request's ids."""
    message = (
        f"Charge ch_3c{_hex(n, 12)} declined for customer cus_{_hex(n + 7, 10)}: "
        f"insufficient_funds (request req_{_hex(n + 3, 14)})"
    )
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/billing/tasks.py", 41, "charge_invoice", "await charge(invoice)"),
            (f"{_app(n)}/billing/payments.py", 88, "charge", "raise CardDeclined(str(err))"),
        ],
        f"billing.payments.CardDeclined: {message}",
    )
    return {"type": "billing.payments.CardDeclined", "message": message, "traceback": traceback}


def mailbox_unknown(n: int) -> dict[str, Any]:
    """Cause 2 (Python): smtplib refusing a recipient, as its exception prints it."""
    address = f"u{8000 + n}@example.com"
    message = (
        f"{{'{address}': (550, b'5.1.1 <{address}>: Recipient address rejected: "
        "User unknown in virtual mailbox table')}"
    )
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/mail/welcome.py", 23, "send_welcome", "smtp.sendmail(FROM, [to], body)"),
            (
                "/usr/lib/python3.12/smtplib.py",
                887,
                "sendmail",
                "raise SMTPRecipientsRefused(senderrs)",
            ),
        ],
        f"smtplib.SMTPRecipientsRefused: {message}",
    )
    return {"type": "smtplib.SMTPRecipientsRefused", "message": message, "traceback": traceback}


def user_missing_in_sync(n: int) -> dict[str, Any]:
    """Cause 3 (Python): ``KeyError('user_8812')`` where the sync reads a user."""
    message = f"'user_{8000 + n}'"
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/sync/handlers.py", 12, "pull", "await pull_user(ctx.payload)"),
            (f"{_app(n)}/sync/users.py", 57, "pull_user", "user = users[payload['user']]"),
        ],
        f"KeyError: {message}",
    )
    return {"type": "KeyError", "message": message, "traceback": traceback}


def user_missing_in_invoice(n: int) -> dict[str, Any]:
    """Cause 4 (Python): the same ``KeyError`` messages as cause 3, raised where the same job
    type builds an invoice: another code path, another cause."""
    message = f"'user_{8000 + n}'"
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/sync/handlers.py", 15, "pull", "await build_invoice(ctx.payload)"),
            (f"{_app(n)}/billing/invoices.py", 30, "build_invoice", "owner = users[row.user]"),
        ],
        f"KeyError: {message}",
    )
    return {"type": "KeyError", "message": message, "traceback": traceback}


def duplicate_order(n: int) -> dict[str, Any]:
    """Cause 5 (Python): asyncpg's unique violation, quoting the constraint and the key."""
    message = (
        'duplicate key value violates unique constraint "orders_pkey"\n'
        f"DETAIL:  Key (id)=({4200 + n}) already exists."
    )
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/orders/importer.py", 64, "save_order", "await conn.execute(INSERT, *row)"),
            (
                f"{_site(n)}/asyncpg/connection.py",
                350,
                "execute",
                "_, status, _ = await self._execute(query, args, 0, timeout, True)",
            ),
            ("asyncpg/protocol/protocol.pyx", 207, "bind_execute", ""),
        ],
        f"asyncpg.exceptions.UniqueViolationError: {message}",
    )
    return {
        "type": "asyncpg.exceptions.UniqueViolationError",
        "message": message,
        "traceback": traceback,
    }


def charges_unavailable(n: int) -> dict[str, Any]:
    """Cause 6 (Python): httpx's 503 for a URL with a query string."""
    message = (
        "Server error '503 Service Unavailable' for url "
        f"'https://api.x.com/v1/charges?id=ch_3c{_hex(n, 12)}&expand=customer'\n"
        "For more information check: https://developer.mozilla.org/en-US/docs/Web/HTTP/Status/503"
    )
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/billing/sync_charges.py", 19, "fetch_charge", "r.raise_for_status()"),
            (
                f"{_site(n)}/httpx/_models.py",
                829,
                "raise_for_status",
                "raise HTTPStatusError(message, request=request, response=self)",
            ),
        ],
        f"httpx.HTTPStatusError: {message}",
    )
    return {"type": "httpx.HTTPStatusError", "message": message, "traceback": traceback}


def report_missing(n: int) -> dict[str, Any]:
    """Cause 7 (Go, a plain error: no stack): a missing file named by the job's user and day."""
    message = (
        f"open /var/data/exports/u{8000 + n}/report-2026-12-{1 + n % 28:02d}.csv: "
        "no such file or directory"
    )
    return {"type": "fs.PathError", "message": message}


def cache_refused(n: int) -> dict[str, Any]:
    """Cause 8 (TypeScript on Node): Redis refusing connections, one of five cache hosts."""
    message = f"connect ECONNREFUSED 10.0.3.{1 + n % 5}:6379"
    root = "/srv/worker" if n % 2 else "/home/node/app"
    stack = (
        f"Error: {message}\n"
        f"    at TCPConnectWrap.afterConnect [as oncomplete] (node:net:{1555 + n % 3 * 52}:16)\n"
        f"    at async RedisCache.get ({root}/dist/cache.js:{41 + n % 3}:17)\n"
        f"    at async renderThumbnail ({root}/dist/jobs/thumbnails.js:88:5)\n"
        f"    at async Worker.run ({root}/node_modules/jobq-client/dist/leases.js:310:22)"
    )
    return {"type": "Error", "message": message, "traceback": stack}


def ledger_refused(n: int) -> dict[str, Any]:
    """Cause 9 (Go, through ``jobq.WithStack``): PostgreSQL refusing connections."""
    message = f"dial tcp 10.0.3.{7 + n % 4}:5432: connect: connection refused"
    gopath = "/root/go" if n % 2 else "/home/ci/go"
    stack = (
        f"net.OpError: {message}\n\n"
        "main.(*Store).Connect(...)\n"
        f"\t/src/ledger/store.go:{57 + n % 3}\n"
        "main.reconcile(...)\n"
        f"\t/src/ledger/reconcile.go:{112 + n % 3}\n"
        "github.com/acme/jobq/clients/go.(*Worker).run(...)\n"
        f"\t{gopath}/pkg/mod/github.com/acme/jobq/clients/go@v0.4.1/worker.go:201\n"
        "runtime.goexit(...)\n"
        "\t/usr/local/go/src/runtime/asm_amd64.s:1700\n"
    )
    return {"type": "net.OpError", "message": message, "traceback": stack}


def _amount(n: int, kind: str) -> dict[str, Any]:
    message = f"invalid amount {n}.50 for currency 'EUR' in row {1000 + n}"
    traceback = python_traceback(
        n,
        [
            (f"{_app(n)}/billing/sync_charges.py", 33, "parse_amount", "raise err(message)"),
        ],
        f"{kind}: {message}",
    )
    return {"type": kind, "message": message, "traceback": traceback}


def amount_invalid(n: int) -> dict[str, Any]:
    """Cause 10 (Python): a ``ValueError`` about an amount."""
    return _amount(n, "ValueError")


def amount_mistyped(n: int) -> dict[str, Any]:
    """Cause 11 (Python): the same messages and frames as cause 10 as a ``TypeError``."""
    return _amount(n, "TypeError")


def upstream_timeout(n: int) -> str:
    """Cause 12 (text, no traceback): a timeout naming the request."""
    return f"upstream timeout after {30 + n % 7}.{n % 10}s (request req_{_hex(n, 8)})"


@dataclass(frozen=True)
class Cause:
    """One cause of the scene: its jobs' queue and type, and the n-th job's error."""

    name: str
    queue: str
    type: str
    error: Callable[[int], dict[str, Any] | str]


CAUSES = (
    Cause("card declined", "billing", "charge", card_declined),
    Cause("mailbox unknown", "emails", "welcome", mailbox_unknown),
    Cause("user missing (sync)", "sync", "pull", user_missing_in_sync),
    Cause("user missing (invoice)", "sync", "pull", user_missing_in_invoice),
    Cause("duplicate order", "orders", "import", duplicate_order),
    Cause("charges API 503", "billing", "sync_charge", charges_unavailable),
    Cause("report missing", "reports", "render", report_missing),
    Cause("cache refused", "media", "thumbnail", cache_refused),
    Cause("ledger refused", "ledger", "reconcile", ledger_refused),
    Cause("amount invalid", "billing", "sync_charge", amount_invalid),
    Cause("amount mistyped", "billing", "sync_charge", amount_mistyped),
    Cause("upstream timeout", "media", "thumbnail", upstream_timeout),
)


async def fail_scene(
    client: httpx.AsyncClient, jobs_per_cause: int = JOBS_PER_CAUSE
) -> dict[str, list[int]]:
    """Fails ``jobs_per_cause`` jobs of each cause (dead: one attempt each) through the API, in
    batches; answers each cause's job ids by its name."""
    ids: dict[str, list[int]] = {}
    for number, cause in enumerate(CAUSES):
        batch = [{"queue": cause.queue, "type": cause.type, "max_attempts": 1}] * jobs_per_cause
        r = await client.post("/v1/jobs/batch", json={"jobs": batch})
        assert r.status_code in (200, 201), r.text
        r = await client.post(
            "/v1/claim",
            json={"worker_id": f"w{number}", "queues": [cause.queue], "max_jobs": 100},
        )
        assert r.status_code == 200, r.text
        held = r.json()["jobs"]
        assert len(held) == jobs_per_cause
        leases = [
            {"job_id": job["id"], "lease_id": job["lease_id"], "error": cause.error(n)}
            for n, job in enumerate(held)
        ]
        # A few leases a call: a call's body is bounded (64 KiB by default).
        for start in range(0, len(leases), FAIL_CALL_LEASES):
            chunk = leases[start : start + FAIL_CALL_LEASES]
            r = await client.post("/v1/fail", json={"worker_id": f"w{number}", "leases": chunk})
            assert r.status_code == 200, r.text
            assert all(result["status"] == "dead" for result in r.json()["results"])
        ids[cause.name] = sorted(job["id"] for job in held)
    return ids
