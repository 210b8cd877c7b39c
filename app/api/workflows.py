"""Workflows: a graph of jobs made in one request, read, cancelled and retried as a whole."""

# No ``from __future__ import annotations`` here: the endpoints are annotated with request models
# built for the app's settings inside build_router, which FastAPI must see as classes.

from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Response, status
from pydantic import BaseModel, Field

from app.api import schemas as wire
from app.api.auth import allow_queue, requires
from app.api.deps import Services
from app.api.job_models import job_models
from app.api.new_jobs import new_job, workflow_fingerprint
from app.api.render import job
from app.api.webhook_models import require_signing
from app.api.workflow_models import WorkflowRequest
from app.auth.keys import Permission, Principal
from app.domain.records import Job as JobRow
from app.domain.states import FINISHED, JobStatus
from app.domain.workflow_records import StepMoved
from app.domain.workflows import GraphError, StepSpec
from app.errors import PROBLEM, IdempotencyKeyReused, InvalidInput
from app.http.strict_json import StrictJSONRoute
from app.queue.workflows import WorkflowKey, WorkflowView
from app.settings import Settings

WorkflowState = Literal["running", "succeeded", "failed", "cancelled"]


class StepView(BaseModel):
    """One step of a workflow as it is now."""

    name: str
    after: list[str]
    job: wire.Job


class Workflow(BaseModel):
    """A workflow and each of its steps' jobs."""

    id: int
    name: str
    created_at: datetime
    created_by: str | None
    state: WorkflowState = Field(
        description="running while any step is open (waiting, scheduled, pending, running); "
        "then succeeded when all succeeded, failed when any ended dead, else cancelled."
    )
    counts: dict[str, int] = Field(description="Steps per job state.")
    steps: list[StepView]


class WorkflowChange(BaseModel):
    """What a cancel or retry of a whole workflow moved."""

    workflow_id: int
    changed: int = Field(description="Steps moved.")
    steps: dict[str, str] = Field(description="Each moved step's name and its new state.")


def workflow_state(steps: Sequence[JobRow]) -> WorkflowState:
    """A workflow's state from its steps' states."""
    states = {s.status for s in steps}
    if states - FINISHED:
        return "running"
    if states == {JobStatus.SUCCEEDED}:
        return "succeeded"
    return "failed" if JobStatus.DEAD in states else "cancelled"


def render_workflow(view: WorkflowView) -> Workflow:
    """The API's view of a workflow and its steps."""
    name_of = {s.id: s.workflow_step or str(s.id) for s in view.steps}
    return Workflow(
        id=view.workflow.id,
        name=view.workflow.name,
        created_at=view.workflow.created_at,
        created_by=view.workflow.created_by,
        state=workflow_state(view.steps),
        counts=dict(Counter(s.status for s in view.steps)),
        steps=[
            StepView(
                name=name_of[s.id],
                after=[name_of.get(p, str(p)) for p in s.depends_on or []],
                job=wire.Job.model_validate(job(s)),
            )
            for s in view.steps
        ],
    )


def build_router(settings: Settings) -> APIRouter:
    """The workflow routes, validating against this app's limits."""
    router = APIRouter(prefix="/v1/workflows", tags=["workflows"], route_class=StrictJSONRoute)
    Key = Annotated[str, wire.at_most(settings.idempotency_key_max_chars)]
    # Built for this app's limits: a step's job fields are bound where every job's are.
    CreateWorkflow = job_models(settings).workflow

    async def _visible(caller: Principal, services: Services, workflow_id: int) -> WorkflowView:
        view = await services.workflows.get(workflow_id)
        if caller.scoped:
            # A scoped key sees a workflow only when it covers every step's queue (403, as a
            # job of another queue is).
            for step in view.steps:
                allow_queue(caller, step.queue, field="path.workflow_id")
        return view

    @router.post(
        "",
        status_code=status.HTTP_201_CREATED,
        response_model=Workflow,
        responses={
            200: {"model": Workflow, "description": "Replay of an idempotent request"},
            403: PROBLEM,
            422: PROBLEM,
        },
    )
    async def create_workflow(
        caller: Annotated[Principal, requires(Permission.ENQUEUE)],
        body: CreateWorkflow,  # type: ignore[valid-type]  # a class built above
        services: Services,
        response: Response,
        idempotency_key: Annotated[
            Key | None,
            Header(
                alias="Idempotency-Key",
                description="Same as the body's idempotency_key (they must agree when both "
                "are sent).",
            ),
        ] = None,
    ) -> Workflow:
        """Creates every step in one transaction. Steps without ``after`` are due at once; the
        others wait, outside the claim index, until their parents end. Duplicate or unknown
        step names, cycles, and ``on_parent_failure`` on a step without ``after`` are refused
        (422 naming the step) before anything is written.

        With an idempotency key (``idempotency_key`` or the ``Idempotency-Key`` header) the
        create is safe to send again: 201 when it made the workflow, 200 with the same workflow
        when the key came with the same request before, 422 when it came with another. Two
        creates with one key at once make one workflow."""
        request: WorkflowRequest = body
        key_field = "body.idempotency_key"
        if idempotency_key is not None:
            if request.idempotency_key is not None and request.idempotency_key != idempotency_key:
                raise InvalidInput(
                    "the Idempotency-Key header and the idempotency_key field differ",
                    errors=[{"field": "header.Idempotency-Key", "message": "differs from body"}],
                )
            if request.idempotency_key is None:
                key_field = "header.Idempotency-Key"
            request = request.model_copy(update={"idempotency_key": idempotency_key})
        for index, step in enumerate(request.steps):
            allow_queue(caller, step.queue, field=f"body.steps[{index}].queue")
        require_signing(
            settings,
            caller,
            (
                (f"body.steps[{i}].callback_url", s.callback_url)
                for i, s in enumerate(request.steps)
            ),
        )
        specs = [
            StepSpec(name=s.name, after=tuple(s.after), job=new_job(s, key_id=caller.key_id))
            for s in request.steps
        ]
        key = (
            WorkflowKey(request.idempotency_key, workflow_fingerprint(request))
            if request.idempotency_key is not None
            else None
        )
        try:
            view = await services.workflows.create(
                name=request.name,
                steps=specs,
                actor=caller.name,
                actor_key_id=caller.key_id,
                key=key,
            )
        except GraphError as bad:
            raise InvalidInput(
                str(bad),
                errors=[{"field": f"body.steps[{bad.index}].{bad.field}", "message": str(bad)}],
            ) from None
        except IdempotencyKeyReused as reused:
            raise IdempotencyKeyReused(
                reused.detail,
                item=0,
                errors=[{"field": key_field, "message": "key reused with a different request"}],
            ) from None
        response.status_code = status.HTTP_201_CREATED if view.created else status.HTTP_200_OK
        return render_workflow(view)

    @router.get("/{workflow_id}", response_model=Workflow, responses={403: PROBLEM, 404: PROBLEM})
    async def get_workflow(
        caller: Annotated[Principal, requires(Permission.READ_JOBS)],
        workflow_id: int,
        services: Services,
    ) -> Workflow:
        """A workflow: its state, and each step's job (state, attempts, progress, result)."""
        return render_workflow(await _visible(caller, services, workflow_id))

    @router.post("/{workflow_id}/cancel", response_model=WorkflowChange, responses={404: PROBLEM})
    async def cancel_workflow(
        caller: Annotated[Principal, requires(Permission.OPERATE)],
        workflow_id: int,
        services: Services,
    ) -> WorkflowChange:
        """Cancels every open step (a running one's lease ends at once); audited."""
        view = await _visible(caller, services, workflow_id)
        moved = await services.workflows.cancel(
            workflow_id, actor=caller.name, actor_key_id=caller.key_id
        )
        return _change(view, moved)

    @router.post(
        "/{workflow_id}/retry",
        response_model=WorkflowChange,
        responses={403: PROBLEM, 404: PROBLEM},
    )
    async def retry_workflow(
        caller: Annotated[Principal, requires(Permission.OPERATE)],
        workflow_id: int,
        services: Services,
    ) -> WorkflowChange:
        """Puts every dead or cancelled step back, attempts reset: due when its parents all
        succeeded, waiting otherwise, so a retried failed step resumes the graph; audited."""
        view = await _visible(caller, services, workflow_id)
        moved = await services.workflows.retry(
            workflow_id, actor=caller.name, actor_key_id=caller.key_id
        )
        return _change(view, moved)

    return router


def _change(view: WorkflowView, moved: Sequence[StepMoved]) -> WorkflowChange:
    name_of = {s.id: s.workflow_step or str(s.id) for s in view.steps}
    steps = {name_of.get(m.id, str(m.id)): m.status for m in moved}
    return WorkflowChange(workflow_id=view.workflow.id, changed=len(moved), steps=steps)
