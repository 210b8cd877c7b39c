"""Reference Python client for jobq (HTTP only, depends on httpx; never imports ``app``).

``Client`` enqueues and reads jobs and speaks the raw worker protocol; ``Worker`` runs async
handlers for claimed jobs with batched heartbeats, checkpoints and a graceful stop.
"""

from jobq_client.client import Client
from jobq_client.errors import JobqError, LeaseLost, NonRetryableError, StopRequested
from jobq_client.worker import JobContext, Worker

__all__ = [
    "Client",
    "JobContext",
    "JobqError",
    "LeaseLost",
    "NonRetryableError",
    "StopRequested",
    "Worker",
]
