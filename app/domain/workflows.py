"""A workflow's steps as a graph (pure): names, edges, the order they are created in.

``POST /v1/workflows`` names its steps and says which come ``after`` which; this module checks
the graph (unique names, known names, no cycle, ``on_parent_failure`` only where there are
parents) and gives the creation order, parents first, so
each step's ``depends_on`` can name ids reserved for steps already placed.
"""

from __future__ import annotations

import graphlib
from collections.abc import Sequence
from dataclasses import dataclass

from app.domain.types import NewJob


@dataclass(frozen=True)
class StepSpec:
    """One step of a workflow: its name, the steps it waits for, and its job."""

    name: str
    after: tuple[str, ...]
    job: NewJob


class GraphError(ValueError):
    """The steps do not form a graph jobq can run; ``index`` and ``field`` name the step."""

    def __init__(self, message: str, *, index: int, field: str) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


def creation_order(steps: Sequence[StepSpec]) -> list[int]:
    """The steps' indexes, every step after those it waits for; raises :class:`GraphError`."""
    index_of: dict[str, int] = {}
    for i, step in enumerate(steps):
        if step.name in index_of:
            raise GraphError(f"step name {step.name!r} is used twice", index=i, field="name")
        index_of[step.name] = i
        if step.job.on_parent_failure is not None and not step.after:
            raise GraphError(
                "on_parent_failure needs after: a step that waits for none has no parent to fail",
                index=i,
                field="on_parent_failure",
            )
    sorter: graphlib.TopologicalSorter[int] = graphlib.TopologicalSorter()
    for i, step in enumerate(steps):
        for parent in step.after:
            if parent not in index_of:
                raise GraphError(f"after names no step {parent!r}", index=i, field="after")
            if parent == step.name:
                raise GraphError(f"step {step.name!r} waits for itself", index=i, field="after")
        sorter.add(i, *(index_of[p] for p in step.after))
    try:
        # Parents first; among steps ready together, the order they were given in.
        sorter.prepare()
    except graphlib.CycleError as cycle:
        members: list[int] = list(cycle.args[1])
        names = " -> ".join(steps[m].name for m in members)
        first = min(members[:-1] or members)
        raise GraphError(f"the steps form a cycle: {names}", index=first, field="after") from None
    order: list[int] = []
    while sorter.is_active():
        ready = sorted(sorter.get_ready())
        order.extend(ready)
        sorter.done(*ready)
    return order
