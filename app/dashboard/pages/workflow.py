"""One workflow (``/dashboard/workflows/{id}``): its state, a graph of its steps, the steps' table,
and cancel or retry of the whole workflow.

The graph is an SVG drawn here (``app/dashboard/graph.py`` lays it out), each box a link to its
step's job, coloured by the job's state. A workflow takes up to ``workflow_max_steps`` steps
(1,000 by default); the graph is drawn up to :data:`GRAPH_MAX_STEPS` steps,
:data:`GRAPH_MAX_EDGES` dependencies and :data:`GRAPH_MAX_BENDS` bend points, at its natural
size in a box that scrolls; past those the page says so and the table (always there, the
accessible view) lists the steps alone.

A key scoped to some queues sees a workflow only when it covers every step's queue: otherwise
403, as a job of another queue is. Cancel and retry are confirmed first, like the jobs page's
bulk actions: the confirmation lists the steps the action would move now; the action then
moves the workflow's steps as they are when it runs, and the result says how many moved.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from fastapi import Response

from app.api.workflows import workflow_state
from app.dashboard.base import PREFIX, STATES
from app.dashboard.board import READ, READ_OPERATE, Call, Route
from app.dashboard.graph import Drawing, layout, measure
from app.dashboard.session import Flash
from app.domain.bounds import valid_id
from app.domain.states import JobStatus
from app.errors import Forbidden, NotFound
from app.queue.workflows import WorkflowView

GRAPH_MAX_STEPS = 500
GRAPH_MAX_EDGES = 2_000
GRAPH_MAX_BENDS = 5_000

# The steps each action moves (app/store/sql/workflows.sql: workflow_cancel, workflow_retry).
MOVES: dict[str, tuple[str, ...]] = {
    "cancel": (
        JobStatus.WAITING,
        JobStatus.SCHEDULED,
        JobStatus.PENDING,
        JobStatus.RUNNING,
    ),
    "retry": (JobStatus.DEAD, JobStatus.CANCELLED),
}
_DONE = {"cancel": "Cancelled", "retry": "Retried"}


@dataclass(frozen=True)
class StepRow:
    """One step as the page shows it: its name, the steps it comes after, and its job."""

    name: str
    after: list[str]
    state: str  # the job's state, retrying told apart
    job: dict[str, Any]


def workflow_id(text: str) -> int:
    """A workflow id from a path, or NotFound when it cannot be one."""
    if not text.isascii() or not text.isdigit() or not valid_id(int(text)):
        raise NotFound(f"workflow {text[:40]!r} not found")
    return int(text)


async def _visible(call: Call) -> WorkflowView:
    """The workflow of the path, if the visitor's key covers every step's queue (else 403)."""
    found = await call.services.workflows.get(
        workflow_id(str(call.request.path_params.get("workflow_id", "")))
    )
    principal = call.caller.principal
    for step in found.steps:
        if not principal.covers(step.queue):
            raise Forbidden(f"Key {principal.name!r} is not scoped to queue {step.queue!r}.")
    return found


def step_rows(view: WorkflowView) -> list[StepRow]:
    """The workflow's steps in the order they were created, named as the API names them."""
    name_of = {s.id: s.workflow_step or str(s.id) for s in view.steps}
    return [
        StepRow(
            name=name_of[s.id],
            after=[name_of.get(p, f"#{p}") for p in s.depends_on or []],
            state="retrying" if s.retrying else s.status,
            job={**asdict(s), "retrying": s.retrying},
        )
        for s in view.steps
    ]


def drawing(rows: list[StepRow]) -> tuple[Drawing | None, str | None]:
    """The graph of the steps, or why it is not drawn (too large to read as a picture)."""
    # Keyed by job id: unique even where names are not (a step with no name shows its id).
    steps = [(str(r.job["id"]), [str(p) for p in r.job["depends_on"] or ()]) for r in rows]
    size = measure(steps)
    if size.steps > GRAPH_MAX_STEPS:
        return None, f"{size.steps} steps: the graph is drawn up to {GRAPH_MAX_STEPS}."
    if size.edges > GRAPH_MAX_EDGES:
        return None, f"{size.edges} dependencies: the graph is drawn up to {GRAPH_MAX_EDGES}."
    if size.bends > GRAPH_MAX_BENDS:
        return None, "Too many dependencies span several layers to draw them legibly."
    return layout(steps), None


def _summary(view: WorkflowView) -> dict[str, Any]:
    counted = Counter("retrying" if s.retrying else s.status for s in view.steps)
    return {
        **asdict(view.workflow),
        "state": workflow_state(view.steps),
        "counts": {s: counted[s] for s in STATES if counted[s]},
        "total": len(view.steps),
        "movable": {
            action: sum(1 for s in view.steps if s.status in states)
            for action, states in MOVES.items()
        },
    }


async def workflow(call: Call) -> Response:
    """One workflow: state, counts, the graph of its steps, the steps' table, actions."""
    view = await _visible(call)
    rows = step_rows(view)
    graph, too_large = drawing(rows)
    return call.page(
        "workflow",
        nav="jobs",
        workflow=_summary(view),
        steps=rows,
        graph=graph,
        by_key={str(r.job["id"]): r for r in rows},
        too_large=too_large,
    )


def _action(call: Call) -> str:
    action = str(call.request.path_params.get("action", ""))
    if action not in MOVES:
        raise NotFound(f"no workflow action {action[:40]!r}")
    return action


async def workflow_confirm(call: Call) -> Response:
    """The confirmation of a cancel or retry: the steps it would move now, listed."""
    action = _action(call)
    view = await _visible(call)
    moving = [r for r in step_rows(view) if r.job["status"] in MOVES[action]]
    return call.render(
        "workflow_confirm.html",
        nav="jobs",
        action=action,
        workflow=_summary(view),
        moving=moving,
        touched=[str(s) for s in MOVES[action]],
    )


async def workflow_run(call: Call) -> Response:
    """Cancels or retries the workflow's steps; back to its page with how many moved."""
    action = _action(call)
    view = await _visible(call)
    principal = call.caller.principal
    change = call.services.workflows.cancel if action == "cancel" else call.services.workflows.retry
    moved = await change(view.workflow.id, actor=principal.name, actor_key_id=principal.key_id)
    noun = "step" if len(moved) == 1 else "steps"
    confirmed = call.form.get("confirmed", "")
    note = ""
    if confirmed.isascii() and confirmed.isdigit() and int(confirmed) != len(moved):
        note = f" ({int(confirmed)} when you confirmed: steps changed state since)"
    return call.redirect(
        f"{PREFIX}/workflows/{view.workflow.id}",
        Flash("ok", f"{_DONE[action]} {len(moved)} {noun}{note}"),
    )


ROUTES = (
    Route("GET", PREFIX + "/workflows/{workflow_id}", workflow, READ),
    Route("GET", PREFIX + "/fragments/workflows/{workflow_id}", workflow, READ),
    Route("GET", PREFIX + "/workflows/{workflow_id}/{action}", workflow_confirm, READ_OPERATE),
    Route(
        "POST",
        PREFIX + "/workflows/{workflow_id}/{action}",
        workflow_run,
        READ_OPERATE,
        action=True,
    ),
)
