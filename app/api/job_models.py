"""The request models that make jobs, built once per app with its settings' limits.

Every way of making a job over HTTP shares the job's fields: ``POST /v1/jobs``, a batch's jobs
and its callback, a workflow's steps, and a queue's default ``callback_url`` (``PUT
/v1/queues/{name}``). The limits a deployment may change (queue name and type lengths, the
idempotency key's, ``depends_on``'s count, the callback_url's length and address policy) are
bound to those fields here and nowhere else: the step, the batch callback and the single job
extend one bound template, so a rule holds for all of them or for none.
"""

# No ``from __future__ import annotations`` here: pydantic and FastAPI read the annotations of
# the classes built inside job_models, which name that function's local types.

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Annotated

from pydantic import Field

from app.api import schemas as wire
from app.api.webhook_models import callback_url_type
from app.api.workflow_models import WorkflowRequest, WorkflowStep
from app.settings import Settings


@dataclass(frozen=True)
class JobModels:
    """The request models of one app's limits (mypy sees the default-limits classes they extend)."""

    enqueue: type[wire.EnqueueRequest]
    batch: type[wire.EnqueueBatchRequest]
    workflow: type[WorkflowRequest]
    queue_settings: type[wire.QueueSettings]


# The models depend on these settings only; apps made with the same ones (three routers of each
# app, and every app a test run makes) share one set: pydantic builds a model's validator when
# its class is made, which took 84 ms of each create_app.
_LIMITS = (
    "queue_name_max_chars",
    "type_max_chars",
    "idempotency_key_max_chars",
    "depends_on_max",
    "batch_max_jobs",
    "workflow_max_steps",
    "webhook_url_max_chars",
    "webhook_allowed_networks",
)
_BUILT: dict[tuple[object, ...], JobModels] = {}


def job_models(settings: Settings) -> JobModels:
    """The models of every request that makes a job, validating against these settings."""
    key = tuple(getattr(settings, name) for name in _LIMITS)
    built = _BUILT.get(key)
    if built is None:
        built = _BUILT[key] = _build(settings)
    return built


def _build(settings: Settings) -> JobModels:
    queue_max = settings.queue_name_max_chars
    Queue = Annotated[str, wire.queue_name_rule(queue_max), wire.queue_name_doc(queue_max)]
    JobType = Annotated[str, wire.at_most(settings.type_max_chars)]
    Key = Annotated[str, wire.at_most(settings.idempotency_key_max_chars)]
    CallbackUrl = callback_url_type(settings)
    callback_doc = wire.JobTemplate.model_fields["callback_url"].description
    key_doc = wire.EnqueueRequest.model_fields["idempotency_key"].description

    # The template's bound fields, declared once: every model below extends this class.
    class JobTemplate(wire.JobTemplate):
        __doc__ = wire.JobTemplate.__doc__
        queue: Queue = "default"
        type: JobType
        callback_url: CallbackUrl | None = Field(  # type: ignore[valid-type]
            default=None, description=callback_doc
        )

    # Named as on the wire: OpenAPI names its components after these classes.
    class EnqueueRequest(JobTemplate, wire.EnqueueRequest):
        __doc__ = wire.EnqueueRequest.__doc__
        idempotency_key: Key | None = Field(default=None, description=key_doc)
        depends_on: list[wire.JobId] | None = Field(
            default=None,
            min_length=1,
            max_length=settings.depends_on_max,
            description=wire.EnqueueRequest.model_fields["depends_on"].description,
        )

    class BatchCallback(EnqueueRequest, wire.BatchCallback):
        __doc__ = wire.BatchCallback.__doc__

    class EnqueueBatchRequest(wire.EnqueueBatchRequest):
        __doc__ = wire.EnqueueBatchRequest.__doc__
        jobs: Sequence[EnqueueRequest] = Field(min_length=1, max_length=settings.batch_max_jobs)
        callback: BatchCallback | None = Field(
            default=None,
            description=wire.EnqueueBatchRequest.model_fields["callback"].description,
        )

    class Step(JobTemplate, WorkflowStep):
        __doc__ = WorkflowStep.__doc__

    class CreateWorkflow(WorkflowRequest):
        __doc__ = WorkflowRequest.__doc__
        steps: Sequence[Step] = Field(min_length=1, max_length=settings.workflow_max_steps)
        idempotency_key: Key | None = Field(
            default=None, description=WorkflowRequest.model_fields["idempotency_key"].description
        )

    class QueueSettings(wire.QueueSettings):
        __doc__ = wire.QueueSettings.__doc__
        callback_url: CallbackUrl | None = Field(  # type: ignore[valid-type]
            default=None,
            description=wire.QueueSettings.model_fields["callback_url"].description,
        )

    return JobModels(
        enqueue=EnqueueRequest,
        batch=EnqueueBatchRequest,
        workflow=CreateWorkflow,
        queue_settings=QueueSettings,
    )
