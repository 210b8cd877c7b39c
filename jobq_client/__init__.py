"""Reference Python client for jobq (HTTP only, depends on httpx; never imports ``app``).

``Client`` enqueues and reads jobs (alone, in batches with a callback, or as workflows) and
speaks the raw worker protocol; ``Worker`` runs async handlers for claimed jobs with batched
heartbeats, checkpoints and a graceful stop.

The names below are the public API. Inside: ``worker`` (claim loop, run / stop / drain),
``leases`` (heartbeats, checkpoint saves, complete / fail / release), ``context``
(``JobContext``), ``client`` (HTTP calls), ``composing`` (``Step``, ``Callback``,
``EnqueuedBatch``), ``retry`` (transient errors, backoff), ``errors``, ``webhooks``
(``verify_signature`` for receivers of completion webhooks).
"""

from jobq_client.client import Client, LeaseResults
from jobq_client.composing import Callback, EnqueuedBatch, Step
from jobq_client.context import JobContext
from jobq_client.errors import (
    JobqError,
    LeaseLost,
    NonRetryableError,
    StopRequested,
    WaitTimeout,
    WorkflowWaitTimeout,
)
from jobq_client.webhooks import InvalidSignature, verify_signature
from jobq_client.worker import Worker

__all__ = [
    "Callback",
    "Client",
    "EnqueuedBatch",
    "InvalidSignature",
    "JobContext",
    "JobqError",
    "LeaseLost",
    "LeaseResults",
    "NonRetryableError",
    "Step",
    "StopRequested",
    "WaitTimeout",
    "Worker",
    "WorkflowWaitTimeout",
    "verify_signature",
]
