"""Request bodies of ``POST /v1/workflows``: named steps, each a job template, and the whole.

The models here carry the default limits; ``app/api/job_models.py`` builds the ones a deployment
validates with, the step's job fields bound in the same place as every other job's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated

from pydantic import Field

from app.api.schemas import IdempotencyKey, JobTemplate, StrictModel, at_most

STEP_NAME_MAX_CHARS = 128
WORKFLOW_NAME_MAX_CHARS = 255
StepName = Annotated[str, at_most(STEP_NAME_MAX_CHARS)]


class WorkflowStep(JobTemplate):
    """One step: a job template (the fields of ``POST /v1/jobs`` but idempotency_key,
    depends_on and ordering_key), its name, and the steps it runs ``after``. It becomes due once
    every one of those succeeded (or ended at all, with ``on_parent_failure: run``, which only a
    step with ``after`` takes); its claim carries their results (``parents``)."""

    name: StepName
    after: list[StepName] = Field(default_factory=list, description="Steps this one waits for.")


class WorkflowRequest(StrictModel):
    """A workflow: named steps created in one transaction, cycles refused."""

    name: Annotated[str, at_most(WORKFLOW_NAME_MAX_CHARS)]
    steps: Sequence[WorkflowStep] = Field(min_length=1)
    idempotency_key: IdempotencyKey | None = Field(
        default=None,
        description="Makes the create safe to send again: the same key with the same request "
        "answers the workflow it made (200), with a different request a 422. One namespace for "
        "all workflows; may also come as the Idempotency-Key header. Remembered as long as the "
        "workflow is kept: until every step's job is pruned or deleted.",
    )
