"""The workflow graph's layout (app/dashboard/graph.py): layers follow the edges, boxes never
overlap, arrows join the right boxes and go around the boxes they pass, and the same steps
always give the same drawing."""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from itertools import combinations

from app.dashboard.graph import BEND_HEIGHT, NODE_WIDTH, Box, Drawing, layers, layout, measure

Steps = list[tuple[str, list[str]]]


def random_dag(seed: int, n: int, fan: int = 3) -> Steps:
    """``n`` steps, each after up to ``fan`` earlier ones, shuffled (parents may come later)."""
    rng = random.Random(seed)
    steps = [
        (f"s{i}", [f"s{p}" for p in rng.sample(range(i), min(i, rng.randint(0, fan)))])
        for i in range(n)
    ]
    rng.shuffle(steps)
    return steps


def boxes_of(drawing: Drawing) -> dict[str, Box]:
    return {b.key: b for b in drawing.boxes}


def overlap(a: Box, b: Box) -> bool:
    return (
        a.x < b.x + b.width
        and b.x < a.x + a.width
        and a.y < b.y + b.height
        and b.y < a.y + a.height
    )


def points(path: str) -> list[tuple[float, float]]:
    """Every coordinate pair of a path (control points included)."""
    return [(float(x), float(y)) for x, y in re.findall(r"(-?[\d.]+),(-?[\d.]+)", path)]


def crossings(drawing: Drawing, steps: Sequence[tuple[str, Sequence[str]]]) -> int:
    """Crossings between edges joining adjacent layers (by the boxes' order in each layer)."""
    box = boxes_of(drawing)
    edges = [(box[p], box[c]) for c, ps in steps for p in ps if box[c].layer - box[p].layer == 1]
    return sum(
        1
        for (a, b), (c, d) in combinations(edges, 2)
        if a.layer == c.layer and (a.order - c.order) * (b.order - d.order) < 0
    )


def test_layers_are_the_longest_path_from_a_root() -> None:
    steps: Steps = [
        ("load", ["clean", "extract"]),
        ("extract", []),
        ("clean", ["extract"]),
        ("alone", []),
        ("report", ["load"]),
    ]
    assert layers(steps) == {"load": 2, "extract": 0, "clean": 1, "alone": 0, "report": 3}


def test_every_edge_points_to_a_later_layer_on_random_graphs() -> None:
    for seed in range(30):
        steps = random_dag(seed, 40)
        layer = layers(steps)
        for name, parents in steps:
            for p in parents:
                assert layer[p] < layer[name]
            assert layer[name] == 1 + max((layer[p] for p in parents), default=-1)
        drawing = layout(steps)
        box = boxes_of(drawing)
        assert [b.key for b in drawing.boxes] == [name for name, _ in steps]
        for name, parents in steps:
            for p in parents:
                assert box[p].x + box[p].width < box[name].x  # left to right


def test_no_two_boxes_overlap_and_all_fit_in_the_drawing() -> None:
    for seed in range(30):
        drawing = layout(random_dag(seed, 60, fan=4))
        for a, b in combinations(drawing.boxes, 2):
            assert not overlap(a, b), (a, b)
        for b in drawing.boxes:
            assert b.x >= 0 and b.x + b.width <= drawing.width
            assert b.y >= 0 and b.y + b.height <= drawing.height


def test_one_arrow_per_dependency_from_parent_to_child() -> None:
    steps = random_dag(7, 50)
    drawing = layout(steps)
    box = boxes_of(drawing)
    expected = sorted((p, name) for name, parents in steps for p in parents)
    assert sorted((a.source, a.target) for a in drawing.arrows) == expected
    for arrow in drawing.arrows:
        path = points(arrow.path)
        source, target = box[arrow.source], box[arrow.target]
        assert path[0] == (source.x + source.width, round(source.y + source.height / 2, 1))
        assert path[-1] == (target.x, round(target.y + target.height / 2, 1))
        assert arrow.path.startswith("M")


def test_an_arrow_spanning_layers_passes_beside_the_boxes_between() -> None:
    # a -> d skips the layer of b and c; its bend must not cross their boxes.
    steps: Steps = [("a", []), ("b", ["a"]), ("c", ["a"]), ("d", ["b", "c", "a"])]
    drawing = layout(steps)
    box = boxes_of(drawing)
    [long] = [a for a in drawing.arrows if (a.source, a.target) == ("a", "d")]
    straight = re.search(r"L([\d.]+),([\d.]+)", long.path)
    assert straight is not None
    y = float(straight[2])
    assert float(straight[1]) == box["b"].x + NODE_WIDTH  # along the middle column
    for name in ("b", "c"):
        assert not box[name].y - BEND_HEIGHT < y < box[name].y + box[name].height + BEND_HEIGHT
    assert measure(steps).bends == 1 and measure(steps).edges == 5


def test_the_ordering_removes_avoidable_crossings() -> None:
    # Given crossed: a's child listed after b's, twice over.
    steps: Steps = [
        ("a", []),
        ("b", []),
        ("child of b", ["b"]),
        ("child of a", ["a"]),
        ("grandchild of a", ["child of a"]),
        ("grandchild of b", ["child of b"]),
    ]
    drawing = layout(steps)
    assert crossings(drawing, steps) == 0


def test_the_same_steps_give_the_same_drawing() -> None:
    steps = random_dag(3, 80, fan=3)
    first = layout(steps)
    again = layout([(name, list(parents)) for name, parents in steps])
    assert first == again
    assert layout(steps[:1]) == layout(steps[:1])


def test_odd_input_is_drawn_without_failing() -> None:
    assert layout([]) == Drawing(width=24, height=24, boxes=[], arrows=[], layers=0)
    # Unknown parents and self-references are left out; a cycle does not hang.
    drawing = layout([("a", ["nowhere", "a"]), ("b", ["c"]), ("c", ["b"])])
    assert {b.key for b in drawing.boxes} == {"a", "b", "c"}
    assert len(drawing.arrows) == 1
    # A long chain needs no recursion.
    chain = [(f"s{i}", [f"s{i - 1}"] if i else []) for i in range(5000)]
    assert layers(chain)["s4999"] == 4999
    # A step keyed like a bend point keeps its own box.
    odd: Steps = [("x", []), ("0:1", ["x"]), ("y", ["0:1", "x"])]
    assert [b.key for b in layout(odd).boxes] == ["x", "0:1", "y"]
