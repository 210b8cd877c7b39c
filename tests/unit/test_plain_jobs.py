"""PlainJobs: a batch's requests reach the enqueue statement as their own fields."""

from __future__ import annotations

import re

from app.api.new_jobs import plain_jobs
from app.api.schemas import EnqueueRequest
from app.store.statements import statement

# What the service writes on a job, never its producer: a request field by one of these names
# would reach the statement unchecked through a plain batch.
_SERVICE_FIELDS = {
    "id",
    "workflow_id",
    "workflow_step",
    "has_dependents",
    "traceparent",
    "callback_key_id",
    "idempotency_hash",
}


def test_every_request_field_is_an_item_field_the_statement_reads_by_that_name() -> None:
    read = set(re.findall(r"item->>?'(\w+)'", statement("job_enqueue").positional[0]))
    fields = set(EnqueueRequest.model_fields)
    assert fields <= read, fields - read
    assert not fields & _SERVICE_FIELDS


def test_a_batch_with_a_key_parents_or_an_ordering_key_is_not_plain() -> None:
    bare = EnqueueRequest(type="t")
    assert plain_jobs([bare, bare]) is not None
    for linked in (
        EnqueueRequest(type="t", idempotency_key="k"),
        EnqueueRequest(type="t", depends_on=[1]),
        EnqueueRequest(type="t", ordering_key="o"),
    ):
        assert plain_jobs([bare, linked]) is None


def test_an_item_holds_the_fields_its_producer_set_explicit_nulls_included() -> None:
    jobs = plain_jobs(
        [EnqueueRequest.model_validate({"type": "t", "priority": 3, "max_attempts": None})],
        traceparent="tp",
        key_id=9,
    )
    assert jobs is not None
    assert list(jobs.items) == [{"type": "t", "priority": 3, "max_attempts": None}]
    assert (jobs.traceparent, jobs.callback_key_id) == ("tp", 9)
