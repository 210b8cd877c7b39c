"""A workflow drawn as a layered graph (pure): where each step's box goes and each edge's path.

The layout is the usual layered (Sugiyama) one, kept small: each step's layer is the longest
path to it from a root (a step without parents), so every edge points to a later layer and
goes left to right; an edge spanning several layers passes through a point in each layer
between, so it is routed around the boxes there, not through them; within a layer the steps
are ordered by the mean position of their neighbours (a few sweeps down and up, ties kept in
the order given), which removes most crossings of ordinary workflows; each box then sits level
with its parents as far as the boxes above it allow. The same steps in the same order always
give the same drawing.

Everything is in the SVG's own units; the template draws the boxes and paths and escapes every
name, so nothing here builds markup.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import pairwise

NODE_WIDTH = 184
NODE_HEIGHT = 46
LAYER_GAP = 64  # between the columns of boxes, where the edges run
ROW_GAP = 16  # between two boxes of one column
BEND_HEIGHT = 6  # the slot an edge's bend point takes in a column it passes through
MARGIN = 12
SWEEPS = 4  # down-and-up passes of the ordering


@dataclass(frozen=True)
class Box:
    """One step's box: its key, column (layer), place in the column, and top-left corner."""

    key: str
    layer: int
    order: int
    x: float
    y: float
    width: float = NODE_WIDTH
    height: float = NODE_HEIGHT


@dataclass(frozen=True)
class Arrow:
    """One dependency, drawn from the parent's right side to the child's left side."""

    source: str
    target: str
    path: str  # an SVG path ("d"), ending where the arrowhead goes


@dataclass(frozen=True)
class Drawing:
    """A whole graph's geometry: its size, the boxes (in the steps' order) and the arrows."""

    width: float
    height: float
    boxes: list[Box]
    arrows: list[Arrow]
    layers: int


def layers(steps: Sequence[tuple[str, Sequence[str]]]) -> dict[str, int]:
    """Each step's layer: 0 for a root, else one more than its deepest parent.

    Parents that name no step are left out; a cycle (which the API refuses) cannot loop:
    an edge closing one is ignored.
    """
    parents = _parents(steps)
    layer: dict[str, int] = {}
    for name, _ in steps:
        if name in layer:
            continue
        # Depth-first without recursion: a long chain must not hit the recursion limit.
        stack: list[tuple[str, int]] = [(name, 0)]
        visiting = {name}
        while stack:
            node, i = stack[-1]
            ups = parents[node]
            if i < len(ups):
                stack[-1] = (node, i + 1)
                up = ups[i]
                if up not in layer and up not in visiting:
                    visiting.add(up)
                    stack.append((up, 0))
                continue
            stack.pop()
            visiting.discard(node)
            layer[node] = 1 + max((layer[p] for p in ups if p in layer), default=-1)
    return layer


@dataclass(frozen=True)
class Size:
    """What drawing some steps costs: boxes, arrows, and bend points (an arrow spanning k
    layers bends k - 1 times)."""

    steps: int
    edges: int
    bends: int


def measure(steps: Sequence[tuple[str, Sequence[str]]]) -> Size:
    """The size of the drawing of these steps, found without laying them out."""
    layer = layers(steps)
    spans = [layer[name] - layer[p] for name, p in _edges(steps) if layer[p] < layer[name]]
    return Size(steps=len(layer), edges=len(spans), bends=sum(s - 1 for s in spans))


def layout(steps: Sequence[tuple[str, Sequence[str]]]) -> Drawing:
    """The drawing of steps given as ``(key, keys of the steps it comes after)``; a key is any
    string naming one step (the page uses job ids), and an unknown parent key is left out."""
    layer = layers(steps)
    edges = [(p, name) for name, p in _edges(steps) if layer[p] < layer[name]]
    depth = 1 + max(layer.values(), default=-1)

    # Columns of nodes: steps, and a bend point per layer an edge passes through.
    columns: list[list[str]] = [[] for _ in range(depth)]
    for name in dict.fromkeys(name for name, _ in steps):
        columns[layer[name]].append(name)
    height: dict[str, float] = {n: NODE_HEIGHT for column in columns for n in column}
    ups: dict[str, list[str]] = {n: [] for n in height}
    downs: dict[str, list[str]] = {n: [] for n in height}
    chains: list[tuple[str, str, list[str]]] = []
    bends: dict[str, int] = {}  # bend point -> its layer
    for k, (source, target) in enumerate(edges):
        chain = [source]
        for between in range(layer[source] + 1, layer[target]):
            bend = f"{k}:{between}"
            while bend in height:  # a step may be keyed so
                bend = "~" + bend
            bends[bend] = between
            height[bend] = BEND_HEIGHT
            columns[between].append(bend)
            ups[bend], downs[bend] = [], []
            chain.append(bend)
        chain.append(target)
        for a, b in pairwise(chain):
            downs[a].append(b)
            ups[b].append(a)
        chains.append((source, target, chain[1:-1]))

    _order(columns, ups, downs)
    y = _place(columns, ups, height)

    boxes: dict[str, Box] = {}
    for i, column in enumerate(columns):
        for order, node in enumerate(column):
            if node not in bends:
                boxes[node] = Box(node, i, order, _x(i), y[node])
    bottom = max((y[n] + height[n] for n in height), default=float(MARGIN))
    arrows = [
        Arrow(
            source,
            target,
            _path(boxes[source], boxes[target], [(bends[b], y[b]) for b in between]),
        )
        for source, target, between in chains
    ]
    return Drawing(
        width=_x(depth) - LAYER_GAP + MARGIN if depth else 2 * MARGIN,
        height=bottom + MARGIN,
        boxes=[boxes[name] for name in dict.fromkeys(n for n, _ in steps)],
        arrows=arrows,
        layers=depth,
    )


def _parents(steps: Sequence[tuple[str, Sequence[str]]]) -> dict[str, list[str]]:
    known = {name for name, _ in steps}
    out: dict[str, list[str]] = {}
    for name, after in steps:
        out.setdefault(name, [])
        for p in after:
            if p in known and p != name and p not in out[name]:
                out[name].append(p)
    return out


def _edges(steps: Sequence[tuple[str, Sequence[str]]]) -> list[tuple[str, str]]:
    """(child, parent) pairs, each once, in the steps' order."""
    return [(name, p) for name, ups in _parents(steps).items() for p in ups]


def _x(layer: int) -> float:
    return MARGIN + layer * (NODE_WIDTH + LAYER_GAP)


def _order(
    columns: list[list[str]], ups: dict[str, list[str]], downs: dict[str, list[str]]
) -> None:
    """Orders each column by its nodes' mean neighbour position, sweeping down then up."""
    position = {n: i for column in columns for i, n in enumerate(column)}

    def sort(column: list[str], neighbours: dict[str, list[str]]) -> None:
        def key(node: str) -> float:
            near = neighbours[node]
            if not near:
                return float(position[node])
            return sum(position[m] for m in near) / len(near)

        # sorted() is stable: equal means keep the column's current order.
        column[:] = sorted(column, key=key)
        for i, n in enumerate(column):
            position[n] = i

    for _ in range(SWEEPS):
        for column in columns[1:]:
            sort(column, ups)
        for column in reversed(columns[:-1]):
            sort(column, downs)


def _place(
    columns: list[list[str]], ups: dict[str, list[str]], height: dict[str, float]
) -> dict[str, float]:
    """Each node's top: level with the middle of its parents, below the node above it."""
    y: dict[str, float] = {}
    for column in columns:
        wanted = []
        for node in column:
            parents = ups[node]
            if parents:
                middle = sum(y[p] + height[p] / 2 for p in parents) / len(parents)
                wanted.append(middle - height[node] / 2)
            else:
                wanted.append(float("-inf"))
        # Down the column: no higher than wanted, and clear of the node above.
        floor = float(MARGIN)
        placed = []
        for node, want in zip(column, wanted, strict=True):
            top = max(want, floor)
            placed.append(top)
            floor = top + height[node] + ROW_GAP
        for node, top in zip(column, placed, strict=True):
            y[node] = round(top, 1)
    return y


def _path(source: Box, target: Box, bends: Sequence[tuple[int, float]]) -> str:
    """A smooth path from the parent's right middle, through each bend, to the child's left
    middle (where the arrowhead's tip goes)."""
    points = [(source.x + source.width, source.y + source.height / 2)]
    for layer, top in bends:
        middle = top + BEND_HEIGHT / 2
        points.append((_x(layer), middle))
        points.append((_x(layer) + NODE_WIDTH, middle))
    points.append((target.x, target.y + target.height / 2))
    parts = [f"M{_n(points[0][0])},{_n(points[0][1])}"]
    for (x0, y0), (x1, y1) in pairwise(points):
        if y0 == y1:
            parts.append(f"L{_n(x1)},{_n(y1)}")
        else:
            bend = (x1 - x0) / 2
            parts.append(f"C{_n(x0 + bend)},{_n(y0)} {_n(x1 - bend)},{_n(y1)} {_n(x1)},{_n(y1)}")
    return " ".join(parts)


def _n(value: float) -> str:
    """A coordinate as short as it can be written."""
    return f"{round(value, 1):g}"
