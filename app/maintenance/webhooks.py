"""The webhook loop: sends the outcomes of finished jobs to their callbacks, signed, until accepted.

Delivery is at least once. A job with a callback gets a delivery row in the transaction of its
finish (a trigger: app/store/sql/schema/finished.sql), so no finish is lost to a crash; each pass leases a bounded
batch of due deliveries (``FOR UPDATE SKIP LOCKED``, and an in-flight time during which no other
instance takes them), sends them at once, each within the timeout, and records every attempt in
the delivery and the job's history. A 2xx answer delivers; anything else is tried again after an
exponential backoff with jitter until the give-up time after the finish, then the delivery
fails. An address the policy refuses fails it at once; the delivery and the job's history say
only that (producers and viewers read them), the server's log which address it was. If the instance dies mid-send, the
delivery comes due again when its in-flight time is over and another instance sends it: the
receiver may then see it twice, with the same ``Jobq-Delivery-Id`` to deduplicate by.

It runs on every instance that takes part in maintenance (not only the leader): instances
share the work and skip each other's deliveries.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from datetime import datetime

from app.domain.types import DeliveryOutcome, WebhookRetryPolicy
from app.domain.webhook_records import DueDelivery
from app.domain.webhooks import (
    DELIVERY_ATTEMPT_HEADER,
    DELIVERY_ID_HEADER,
    SIGNATURE_HEADER,
    AddressPolicy,
    signature_header,
)
from app.maintenance.runner import BatchLoop
from app.maintenance.webhook_sender import Attempt, WebhookSender
from app.queue.services import Services
from app.settings import setting_default

logger = logging.getLogger("jobq.webhooks")

WEBHOOK_INTERVAL_DEFAULT: float = setting_default("webhook_interval_seconds")
WEBHOOK_BATCH_SIZE_DEFAULT: int = setting_default("webhook_batch_size")
WEBHOOK_TIMEOUT_DEFAULT: float = setting_default("webhook_timeout_seconds")
WEBHOOK_IN_FLIGHT_DEFAULT: float = setting_default("webhook_in_flight_seconds")
WEBHOOK_BACKOFF_BASE_DEFAULT: float = setting_default("webhook_backoff_base_seconds")
WEBHOOK_BACKOFF_CAP_DEFAULT: float = setting_default("webhook_backoff_cap_seconds")
WEBHOOK_GIVE_UP_DEFAULT: float = setting_default("webhook_give_up_seconds")
WEBHOOK_SECRET_GRACE_DEFAULT: float = setting_default("webhook_secret_grace_seconds")

# Public unicast addresses only (JOBQ_WEBHOOK_ALLOWED_NETWORKS unset).
DEFAULT_POLICY = AddressPolicy()

NO_SECRET = (
    "no signing secret: the job was enqueued without an API key and JOBQ_WEBHOOK_SECRET is unset"
)


@dataclass(frozen=True)
class WebhookConfig:
    """How the webhook loop paces, times, retries and signs its deliveries, and where it may send."""

    interval_seconds: float = WEBHOOK_INTERVAL_DEFAULT
    batch_size: int = WEBHOOK_BATCH_SIZE_DEFAULT
    timeout_seconds: float = WEBHOOK_TIMEOUT_DEFAULT
    in_flight_seconds: float = WEBHOOK_IN_FLIGHT_DEFAULT
    backoff_base_seconds: float = WEBHOOK_BACKOFF_BASE_DEFAULT
    backoff_cap_seconds: float = WEBHOOK_BACKOFF_CAP_DEFAULT
    give_up_seconds: float = WEBHOOK_GIVE_UP_DEFAULT
    secret_grace_seconds: float = WEBHOOK_SECRET_GRACE_DEFAULT
    # Signs deliveries of jobs enqueued without a key (JOBQ_WEBHOOK_SECRET); None: none.
    default_secret: str | None = None
    policy: AddressPolicy = DEFAULT_POLICY

    def __post_init__(self) -> None:
        if not 0 < self.interval_seconds <= 60:
            raise ValueError("interval_seconds must be within (0, 60]")
        if not 1 <= self.batch_size <= 1000:
            raise ValueError("batch_size must be within 1..1000")
        if not 0 < self.timeout_seconds <= 120:
            raise ValueError("timeout_seconds must be within (0, 120]")
        if not self.in_flight_seconds >= 2 * self.timeout_seconds:
            raise ValueError("in_flight_seconds must be at least twice timeout_seconds")
        if not 0 < self.backoff_base_seconds <= self.backoff_cap_seconds:
            raise ValueError("backoff_base_seconds must be > 0 and <= backoff_cap_seconds")
        if not self.give_up_seconds > 0:
            raise ValueError("give_up_seconds must be > 0")
        if self.secret_grace_seconds < 0:
            raise ValueError("secret_grace_seconds must be >= 0")

    @property
    def retry(self) -> WebhookRetryPolicy:
        """The backoff and give-up the recorded attempts follow."""
        return WebhookRetryPolicy(
            backoff_base_seconds=self.backoff_base_seconds,
            backoff_cap_seconds=self.backoff_cap_seconds,
            give_up_seconds=self.give_up_seconds,
        )


@dataclass(frozen=True)
class WebhookCounts:
    """What one pass did: deliveries leased, then delivered, to retry, failed, or taken again
    by another sender before this one could record its attempt (``lost``)."""

    taken: int = 0
    delivered: int = 0
    retrying: int = 0
    failed: int = 0
    lost: int = 0


class WebhookDeliveries(BatchLoop[WebhookConfig]):
    """Leases due webhook deliveries, sends them at once, and records each attempt."""

    name = "webhooks"
    leader_only = False

    def __init__(self, *, services: Services, config: WebhookConfig) -> None:
        super().__init__(services=services, config=config)
        self.sender = WebhookSender(policy=config.policy, timeout_seconds=config.timeout_seconds)

    async def run_once(self, *, now: datetime | None = None) -> WebhookCounts:
        """Leases one batch due by ``now`` (default the database's now()), sends each delivery
        and records its attempt; a database error ends the pass after every send is recorded."""
        config = self.config
        due = await self.services.webhooks.take(
            batch_size=config.batch_size,
            in_flight_seconds=config.in_flight_seconds,
            grace_seconds=config.secret_grace_seconds,
            now=now,
        )
        if not due:
            return WebhookCounts()
        ends = await asyncio.gather(*(self._deliver(d, now) for d in due), return_exceptions=True)
        states = [end for end in ends if isinstance(end, str) or end is None]
        errors = [end for end in ends if isinstance(end, BaseException)]
        if errors:
            raise errors[0]
        return WebhookCounts(
            taken=len(due),
            delivered=states.count("delivered"),
            retrying=states.count("pending"),
            failed=states.count("failed"),
            lost=states.count(None),
        )

    async def _deliver(self, delivery: DueDelivery, now: datetime | None) -> str | None:
        """Sends one leased delivery and records the attempt; answers the delivery's state."""
        attempt = await self.attempt(delivery)
        if attempt.detail is not None:
            # Only here: the delivery and the job's history, which producers and viewers read,
            # keep the attempt's error, which names no address.
            logger.warning(
                "webhook delivery %s of job %d: %s",
                delivery.id,
                delivery.job_id,
                attempt.detail,
                extra={
                    "event": (
                        "webhook.refused"
                        if attempt.outcome is DeliveryOutcome.FAILED
                        else "webhook.attempt_failed"
                    ),
                    "job_id": delivery.job_id,
                    "delivery_id": str(delivery.id),
                    "url": delivery.url,
                },
            )
        recorded = await self.services.webhooks.record(
            delivery,
            outcome=attempt.outcome,
            status=attempt.status,
            error=attempt.error,
            policy=self.config.retry,
            now=now,
        )
        return recorded.state if recorded is not None else None

    async def attempt(self, delivery: DueDelivery) -> Attempt:
        """One attempt: the body signed with every secret in force, POSTed to the callback."""
        secrets = [
            s
            for s in (delivery.secret or self.config.default_secret, delivery.previous_secret)
            if s
        ]
        if not secrets:
            return Attempt(DeliveryOutcome.RETRY, error=NO_SECRET)
        body = delivery.body.encode()
        timestamp = int(delivery.taken_at.timestamp())
        headers = {
            SIGNATURE_HEADER: signature_header(timestamp, body, secrets),
            DELIVERY_ID_HEADER: str(delivery.id),
            DELIVERY_ATTEMPT_HEADER: str(delivery.attempts),
        }
        return await self.sender.send(delivery.url, body, headers)

    async def run_batch(self) -> int:
        """One batch; answers the deliveries leased."""
        return (await self.run_once()).taken
