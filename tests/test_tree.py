"""``anysr.tree``: the walker over nested containers of tensors (batches, state dicts, training states)."""

from __future__ import annotations

import gc
import weakref
from collections import OrderedDict, namedtuple
from collections.abc import Iterator

import pytest
import torch

from anysr.tree import tree_map, tree_tensors

Pair = namedtuple("Pair", "lq gt")


@pytest.fixture
def no_gc() -> Iterator[None]:
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def test_containers_keep_their_kinds_and_order() -> None:
    a, b, c = torch.ones(1), torch.zeros(2), torch.full((1,), 3.0)
    obj = {"x": OrderedDict([("p", a), ("q", [b, (c, 7)])]), "s": torch.Size([2, 3]), "n": Pair(a, b)}
    out = tree_map(lambda t: t + 1, obj)
    assert isinstance(out["x"], OrderedDict) and list(out["x"]) == ["p", "q"]
    assert isinstance(out["x"]["q"][1], tuple) and out["x"]["q"][1][1] == 7
    assert out["s"] == torch.Size([2, 3]) and isinstance(out["n"], Pair)
    assert torch.equal(out["x"]["q"][1][0], c + 1) and torch.equal(out["n"].gt, b + 1)
    assert [t.data_ptr() for t in tree_tensors(obj)] == [t.data_ptr() for t in (a, b, c, a, b)]


def test_paths_name_the_place() -> None:
    seen: list[str] = []
    tree_map(lambda t, where: seen.append(where), {"rng": [torch.ones(1)], "k": 1}, path="state",
             leaf=lambda v, where: seen.append(where))
    assert seen == ["state key 'rng'", "state key 'k'", "state['rng'][0]", "state['k']"]


def test_the_walk_leaves_no_reference_cycle(no_gc: None) -> None:
    """What ``fn`` holds dies with the last reference, not at the next garbage collection: an XLA tensor kept
    alive by a cycle becomes an extra output of the next graph, so which graph runs would depend on when the
    collector last ran (a validation graph that was compiled twice in some runs and not in others)."""
    def run() -> weakref.ref:
        held = torch.ones(3)
        tree_map(lambda t, where: held + t, {"a": [torch.zeros(3)]}, path="x", container=lambda v, where: None)
        found = tree_tensors({"a": (held,)})
        assert len(found) == 1
        return weakref.ref(held)

    assert run()() is None
