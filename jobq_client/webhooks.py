"""Receiving jobq's completion webhooks: check a delivery's signature before trusting it.

jobq signs each delivery as Stripe does: the ``Jobq-Signature`` header is
``t=<unix seconds>,v1=<hex>`` (a second ``v1`` while a rotated secret's grace period lasts),
each ``v1`` the HMAC-SHA256 of ``"<t>.<raw body>"`` under a secret of the enqueuing API key
(``GET /v1/webhooks/secret``) or, without keys, ``JOBQ_WEBHOOK_SECRET``. Verify the raw bytes
as received, before parsing them. Deliveries are at least once: deduplicate by the
``Jobq-Delivery-Id`` header (also the body's ``delivery_id``).
"""

from __future__ import annotations

import hashlib
import hmac
import time

SIGNATURE_HEADER = "Jobq-Signature"
DELIVERY_ID_HEADER = "Jobq-Delivery-Id"
# How far a signature's timestamp may lie from the receiver's clock: replays older than this are
# refused. jobq stamps each attempt anew, so a retry is never refused for its age.
TOLERANCE_SECONDS = 300


class InvalidSignature(ValueError):
    """The delivery's signature header is missing, malformed, stale or matches no secret."""


def verify_signature(
    body: bytes,
    header: str | None,
    secrets: str | list[str] | tuple[str, ...],
    *,
    tolerance_seconds: float = TOLERANCE_SECONDS,
    now: float | None = None,
) -> int:
    """Checks a delivery: ``body`` (the raw request body), ``header`` (its ``Jobq-Signature``)
    and the secret(s) the receiver accepts; answers the signed timestamp.

    Raises :class:`InvalidSignature` when the header is missing or malformed, its timestamp is
    more than ``tolerance_seconds`` from ``now`` (default: this machine's clock), or no ``v1``
    value is the HMAC of the body under any of ``secrets``. Compared in constant time.
    """
    if not header:
        raise InvalidSignature(f"no {SIGNATURE_HEADER} header")
    timestamp: int | None = None
    signatures: list[str] = []
    for part in header.split(","):
        name, _, value = part.strip().partition("=")
        if name == "t" and value.isdigit():
            timestamp = int(value)
        elif name == "v1" and value:
            signatures.append(value.strip())
    if timestamp is None or not signatures:
        raise InvalidSignature(f"malformed {SIGNATURE_HEADER} header: t=... and v1=... expected")
    current = time.time() if now is None else now
    if abs(current - timestamp) > tolerance_seconds:
        raise InvalidSignature(f"timestamp {timestamp} is outside the tolerance")
    message = str(timestamp).encode() + b"." + body
    keys = [secrets] if isinstance(secrets, str) else list(secrets)
    for key in keys:
        expected = hmac.new(key.encode(), message, hashlib.sha256).hexdigest()
        if any(hmac.compare_digest(expected, given) for given in signatures):
            return timestamp
    raise InvalidSignature("no signature matches the secret")
