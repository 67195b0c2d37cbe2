"""The mapping space: every genome decodes to a valid mapping; encode inverts decode."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.mapping import mapping_problems
from marssim.search import Genome, MappingSpace
from marssim.system import system_from_dict
from support import DESIGN, make_system
from test_mapping import GRAPH

MIXED = system_from_dict({
    "name": "mixed", "designs": {"os16": DESIGN, "ws16": {**DESIGN, "dataflow": "ws"},
                                 "rs16": {**DESIGN, "dataflow": "rs"}},
    "accelerators": [
        {"id": "a[0-2]", "designs": ["os16", "ws16"], "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}},
        {"id": "b[0-1]", "design": "rs16", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}},
        {"id": "c0", "designs": ["ws16", "rs16"], "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}}],
    "hosts": [{"id": "host0", "dram": {"capacity": "8 GiB", "bandwidth": "50 GB/s"}}],
    "links": [{"pattern": "ring", "nodes": ["a0", "a1", "a2", "b0", "b1", "c0"], "bandwidth": "10 GB/s"},
              {"between": ["host0", "a0"], "bandwidth": "10 GB/s"}]}, "<mixed>")


@pytest.mark.parametrize("system", [make_system(8), MIXED], ids=["uniform", "mixed-designs"])
def test_random_genomes_decode_to_valid_mappings(system):
    space = MappingSpace(GRAPH, system)
    rng = np.random.default_rng(7)
    seen_sets = set()
    for _ in range(200):
        genome = space.random(rng)
        mapping = space.decode(genome)
        assert mapping_problems(mapping, GRAPH, system) == []
        seen_sets.add(len(mapping.sets))
        # segments follow set order and every set gets at least one layer
        assert sorted(set(mapping.op_set)) == list(range(len(mapping.sets)))
        assert list(mapping.op_set) == sorted(mapping.op_set)
        # decoded mappings encode back to a genome that decodes to the same mapping
        assert space.decode(space.encode(mapping)) == mapping
    assert len(seen_sets) > 3


def test_sets_split_where_no_design_is_common():
    space = MappingSpace(GRAPH, MIXED)
    sets = space.sets_of((False,) * 5)
    assert sets == [("a0", "a1", "a2"), ("b0", "b1", "c0")]
    assert space.allowed_designs(("b0", "b1", "c0")) == ("rs16",)


def test_arbitrary_genomes_are_repaired():
    system = make_system(4)
    space = MappingSpace(GRAPH, system)
    wild = Genome(cuts=(True, True, True), designs=("nope",), boundaries=(0, 999, 3, 3), micro_batches=3,
                  shardings=("head",) * 2)
    mapping = space.decode(wild)
    assert mapping_problems(mapping, GRAPH, system) == []
    assert len(mapping.sets) == 4 and mapping.n_stages == 4
    assert mapping.micro_batches in space.micro_batch_choices


def test_balanced_boundaries_follow_flops():
    space = MappingSpace(GRAPH, make_system(4))
    cum = np.cumsum(space.layer_flops)
    for weights in ([1, 1], [1, 3], [2, 1, 1]):
        bounds = space.balanced_boundaries(list(map(float, weights)))
        assert len(bounds) == len(weights) - 1 and list(bounds) == sorted(set(bounds))
        share = np.diff(np.concatenate([[0], cum[np.array(bounds) - 1], [cum[-1]]])) / cum[-1]
        # each segment's FLOP share is within one layer of its target
        target = np.array(weights) / sum(weights)
        assert np.all(np.abs(share - target) <= space.layer_flops.max() / cum[-1] + 1e-12)
