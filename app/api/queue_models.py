"""Bodies of a queue's figures over a window (``GET /v1/queues/{name}/stats``): its failure rates,
each with what it divides, and the wait and run time percentiles of its finished jobs."""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, Field

from app.domain.records import QueueWindowStats as Figures
from app.queue.history import QUEUE_STATS_SCANNED_MAX

# The longest window asked for: as far back as dead jobs are kept by default.
QUEUE_STATS_WINDOW_MAX = 30 * 86_400


class Percentiles(BaseModel):
    """Seconds at the 50th, 95th and 99th percentile (continuous: interpolated between the two
    nearest jobs, PostgreSQL's percentile_cont) over ``jobs`` jobs; null when there are none."""

    jobs: int = Field(description="How many jobs the percentiles are taken over.")
    p50: float | None
    p95: float | None
    p99: float | None


class QueueWindowStats(BaseModel):
    """A queue's jobs that finished in the last ``window_seconds``: outcomes, failure rates and
    how long each job's last attempt waited and ran.

    Read from the queue's newest finished jobs, a bounded number of each state: ``scanned`` says
    how many were read, ``truncated`` that the window may hold more than were read (the figures
    then describe its newest part). Jobs deleted by retention are not counted.
    """

    queue: str
    window_seconds: float
    since: datetime = Field(description="The window's start: jobs finished at or after it.")
    finished: int = Field(description="Jobs that finished in the window: the three below.")
    succeeded: int
    dead: int
    cancelled: int
    dead_rate: float | None = Field(
        description="dead ÷ finished (succeeded + dead + cancelled), 0..1; null when none finished."
    )
    attempts: int = Field(
        description="Attempts of the jobs that succeeded or went dead (as each job counts them: "
        "a released attempt is not charged, an operator's retry starts again at 0)."
    )
    failed_attempts: int = Field(
        description="Of those attempts, the ones that failed: all of a dead job's, all but the "
        "last of a succeeded job's (failures, expired leases and time-outs)."
    )
    failed_attempt_rate: float | None = Field(
        description="failed_attempts ÷ attempts, 0..1; null when there were none."
    )
    wait_seconds: Percentiles = Field(
        description="Due (run_at: the enqueue, or the end of a delay or a retry's backoff) to "
        "claim, of each succeeded or dead job's last attempt; for a job that ran once, enqueue "
        "to its first claim."
    )
    run_seconds: Percentiles = Field(
        description="Claim to the worker's complete or fail, of each succeeded or dead job's "
        "last attempt (attempts ended by an expired lease or a time-out are left out)."
    )
    scanned: int = Field(
        description="Finished jobs of the queue read for these figures (at most "
        f"{QUEUE_STATS_SCANNED_MAX:,} of each state, newest first)."
    )
    truncated: bool = Field(description="The window may hold more jobs than were read.")

    @classmethod
    def of(cls, row: Figures) -> QueueWindowStats:
        """The body of one window's figures."""
        return cls(
            queue=row.queue,
            window_seconds=row.window_seconds,
            since=row.since,
            finished=row.finished,
            succeeded=row.succeeded,
            dead=row.dead,
            cancelled=row.cancelled,
            dead_rate=row.dead_rate,
            attempts=row.attempts,
            failed_attempts=row.failed_attempts,
            failed_attempt_rate=row.failed_attempt_rate,
            wait_seconds=Percentiles(
                jobs=row.wait_jobs, p50=row.wait_p50, p95=row.wait_p95, p99=row.wait_p99
            ),
            run_seconds=Percentiles(
                jobs=row.run_jobs, p50=row.run_p50, p95=row.run_p95, p99=row.run_p99
            ),
            scanned=row.scanned,
            truncated=row.truncated,
        )
