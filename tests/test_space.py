"""The mapping space: every genome decodes to a valid mapping; encode inverts decode; segments go
to any set; H2H's mappings are points of the space."""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from marssim.mapping import AcceleratorSet, Mapping, mapping_problems
from marssim.search import Genome, MappingSpace
from marssim.search.baselines import count_space, h2h, set_collections
from marssim.system import system_from_dict
from marssim.workload import GraphBuilder
from marssim.workload.graph import merge_graphs
from support import DESIGN, RooflineCost, make_system
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

# four fixed accelerators of different designs on a switch, as on herald-soc
FIXED = system_from_dict({
    "name": "fixed4", "designs": {"os16": DESIGN, "ws32": {**DESIGN, "dataflow": "ws", "pe_rows": 32, "pe_cols": 32},
                                  "rs8": {**DESIGN, "dataflow": "rs", "pe_rows": 8, "pe_cols": 8,
                                          "sram_bandwidth": "800 GB/s"},
                                  "is16": {**DESIGN, "dataflow": "is"}},
    "accelerators": [{"id": "p0", "design": "os16", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}},
                     {"id": "p1", "design": "ws32", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}},
                     {"id": "p2", "design": "rs8", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}},
                     {"id": "p3", "design": "is16", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}}],
    "hosts": [{"id": "host0", "dram": {"capacity": "8 GiB", "bandwidth": "50 GB/s"}}],
    "switches": [{"id": "sw"}],
    "links": [{"pattern": "star", "hub": "sw", "nodes": ["p0", "p1", "p2", "p3"], "bandwidth": "20 GB/s",
               "latency": "10 ns"},
              {"between": ["host0", "sw"], "bandwidth": "20 GB/s"}]}, "<fixed4>")


def layer_devices(space: MappingSpace, mapping: Mapping) -> list[tuple[str, ...]]:
    """The devices each layer's first op runs on."""
    return [mapping.sets[mapping.op_set[space._position[layer[0]]]].devices for layer in space.layers]


def assert_canonical(space: MappingSpace, mapping: Mapping) -> None:
    """The form every decoded mapping has: sets are disjoint runs of consecutive accelerators in
    accelerator order, each runs something, one-device layers run ``none``."""
    order = {a: i for i, a in enumerate(space.accelerators)}
    firsts = []
    for s in mapping.sets:
        idx = [order[d] for d in s.devices]
        assert idx == list(range(idx[0], idx[0] + len(idx)))
        firsts.append(idx[0])
    assert firsts == sorted(firsts)
    assert sorted(set(mapping.op_set)) == list(range(len(mapping.sets)))
    for k, si in enumerate(mapping.op_set):
        if len(mapping.sets[si].devices) == 1:
            assert mapping.op_sharding[k] == "none"


@pytest.mark.parametrize("system", [make_system(8), MIXED, FIXED], ids=["uniform", "mixed-designs", "fixed"])
def test_random_genomes_decode_to_valid_canonical_mappings_and_round_trip(system):
    space = MappingSpace(GRAPH, system)
    rng = np.random.default_rng(7)
    seen_sets, returns, more_segments = set(), 0, 0
    for _ in range(200):
        genome = space.random(rng)
        mapping = space.decode(genome)
        assert mapping_problems(mapping, GRAPH, system) == []
        assert_canonical(space, mapping)
        seen_sets.add(len(mapping.sets))
        # encode(decode(g)) is a genome of the same mapping, and a fixed point
        again = space.encode(mapping)
        assert space.decode(again) == mapping
        assert space.encode(space.decode(again)) == again
        assert len(again.assignment) == len(again.boundaries) + 1 == mapping.n_stages
        returns += len(set(mapping.op_set)) < mapping.n_stages  # a set runs two separate segments
        more_segments += mapping.n_stages > len(mapping.sets)
    assert len(seen_sets) > 2
    assert returns > 10 and more_segments > 10


def test_sets_split_where_no_design_is_common():
    space = MappingSpace(GRAPH, MIXED)
    sets = space.sets_of((False,) * 5)
    assert sets == [("a0", "a1", "a2"), ("b0", "b1", "c0")]
    assert space.allowed_designs(("b0", "b1", "c0")) == ("rs16",)


def test_arbitrary_genomes_are_repaired():
    """Boundaries out of range or repeated are dropped, set indices taken modulo the sets, extra
    boundaries cut, unknown designs and strategies replaced; worked out by hand below."""
    system = make_system(4)
    space = MappingSpace(GRAPH, system)
    n = space.n_layers
    # four one-device sets; boundaries {3, 5} survive; segments [0,3) [3,5) [5,n) on sets 9%4=1,
    # -2%4=2 and 5%4=1: acc1 runs two separate segments, acc2 one, acc0 and acc3 nothing
    wild = Genome(cuts=(True, True, True), designs=("nope",), boundaries=(5, 0, 3, 3, 999), micro_batches=3,
                  shardings=("head",) * 2, assignment=(9, -2, 5))
    mapping = space.decode(wild)
    assert mapping_problems(mapping, GRAPH, system) == []
    assert mapping.sets == (AcceleratorSet(("acc1",), "os16"), AcceleratorSet(("acc2",), "os16"))
    assert [d[0] for d in layer_devices(space, mapping)] == ["acc1"] * 3 + ["acc2"] * 2 + ["acc1"] * (n - 5)
    assert mapping.n_stages == 3 and set(mapping.op_sharding) == {"none"}
    assert mapping.micro_batches in space.micro_batch_choices
    # more boundaries than the assignment describes: the extra ones are cut from the end
    short = Genome(cuts=(True, True, True), designs=(), boundaries=(2, 4, 6), micro_batches=1, shardings=(),
                   assignment=(3, 0))
    assert [d[0] for d in layer_devices(space, space.decode(short))] == ["acc3"] * 2 + ["acc0"] * (n - 2)


def test_a_genome_without_assignment_is_a_pipeline_in_set_order():
    system = make_system(4)
    space = MappingSpace(GRAPH, system)
    wild = Genome(cuts=(True, True, True), designs=("nope",), boundaries=(0, 999, 3, 3), micro_batches=3,
                  shardings=("head",) * 2)
    mapping = space.decode(wild)
    assert mapping_problems(mapping, GRAPH, system) == []
    assert len(mapping.sets) == 4 and mapping.n_stages == 4
    assert list(mapping.op_set) == sorted(mapping.op_set)


def test_sets_take_any_segments_and_multi_device_sets_shard():
    """Two sets of two devices: segments 0 and 2 on the second set, segment 1 on the first."""
    system = make_system(4)
    space = MappingSpace(GRAPH, system)
    g = Genome(cuts=(False, True, False), designs=("os16", "os16"), boundaries=(2, 5), micro_batches=2,
               shardings=("dp",) * space.n_layers, assignment=(1, 0, 1))
    m = space.decode(g)
    assert m.sets == (AcceleratorSet(("acc0", "acc1"), "os16"), AcceleratorSet(("acc2", "acc3"), "os16"))
    expected = [("acc2", "acc3")] * 2 + [("acc0", "acc1")] * 3 + [("acc2", "acc3")] * (space.n_layers - 5)
    assert layer_devices(space, m) == expected
    assert m.n_stages == 3 and "dp" in m.op_sharding
    again = space.encode(m)
    assert (again.cuts, again.boundaries, again.assignment, again.micro_batches) == (g.cuts, (2, 5), (1, 0, 1), 2)
    assert space.decode(again) == m


def test_h2h_style_mappings_encode_and_decode_to_the_same_mapping():
    """Every layer whole on one accelerator, in any order, accelerators left idle or revisited:
    singleton sets, segments the maximal runs of layers on one accelerator."""
    space = MappingSpace(GRAPH, FIXED)
    n = space.n_layers
    rng = np.random.default_rng(0)
    accs = FIXED.accelerator_ids
    for _ in range(30):
        where = [int(x) for x in rng.integers(4, size=n)]
        if rng.random() < 0.5:
            where = [min(w, 2) for w in where]  # p3 idle
        used = sorted(set(where))
        position = {gi: k for k, gi in enumerate(GRAPH.compute_ops)}
        op_set = [0] * len(GRAPH.compute_ops)
        for li, layer in enumerate(space.layers):
            for gi in layer:
                op_set[position[gi]] = used.index(where[li])
        m = Mapping(sets=tuple(AcceleratorSet((accs[a],), FIXED.accelerator(accs[a]).designs[0]) for a in used),
                    op_set=tuple(op_set), op_sharding=("none",) * len(op_set), micro_batches=1,
                    system=space.system_ref, workload=GRAPH.spec)
        g = space.encode(m)
        assert space.decode(g) == m
        runs = 1 + sum(a != b for a, b in zip(where, where[1:]))
        assert len(g.assignment) == runs and g.boundaries == tuple(
            i for i in range(1, n) if where[i] != where[i - 1])


def test_h2h_results_are_points_of_the_space():
    """H2H's own mappings (two models side by side on a fixed heterogeneous system) encode, and
    decode back to themselves."""
    def mlp(name, width):
        b = GraphBuilder(name, batch=2)
        x = b.input("x", c=width)
        for i in range(3):
            x = b.linear(f"l{i}", x, width)
        return b.build()

    def cnn(name):
        b = GraphBuilder(name, batch=2)
        x = b.input("img", c=16, h=16, w=16)
        for i in range(3):
            x = b.conv(f"c{i}", x, 32, kernel=3)
        return b.build()

    graph = merge_graphs("trio", [cnn("cnn"), mlp("mlp", 512), mlp("wide", 1024)])
    res = h2h(graph, FIXED, RooflineCost())
    space = MappingSpace(graph, FIXED)
    assert all(len(s.devices) == 1 for s in res.best.sets) and len(res.best.sets) > 1
    assert space.decode(space.encode(res.best)) == res.best


def test_a_hand_written_mapping_with_an_idle_set_encodes_to_the_same_placement():
    """The shipped herald-soc mix-vision mapping leaves os0 idle: the genome runs every op on the
    same device (os0's set, which runs nothing, is dropped)."""
    from marssim.mapping import load_mapping

    path = Path(__file__).resolve().parents[1] / "topologies" / "mappings" / "herald-soc-mix-vision.yaml"
    mapping, graph, system = load_mapping(path)
    space = MappingSpace(graph, system)
    decoded = space.decode(space.encode(mapping))
    assert "os0" not in [d for s in decoded.sets for d in s.devices]
    devices = [mapping.sets[k].devices for k in mapping.op_set]
    assert [decoded.sets[k].devices for k in decoded.op_set] == devices
    assert decoded.op_sharding == mapping.op_sharding and len(set(devices)) == 3


def test_encode_refuses_what_the_space_cannot_hold():
    system = make_system(4)
    space = MappingSpace(GRAPH, system)
    with pytest.raises(ValueError, match="consecutive"):
        space.encode(Mapping.single_set(GRAPH, system, devices=("acc0", "acc2"), design="os16"))
    # layers on acc0 and acc2, acc1 idle between them: a partition of three sets at least
    n_ops = len(GRAPH.compute_ops)
    split = Mapping(sets=(AcceleratorSet(("acc0",), "os16"), AcceleratorSet(("acc2",), "os16")),
                    op_set=(0,) * (n_ops - 1) + (1,), op_sharding=("none",) * n_ops,
                    system=space.system_ref, workload=GRAPH.spec)
    assert space.decode(space.encode(split)) == split
    with pytest.raises(ValueError, match="more than 2"):
        MappingSpace(GRAPH, system, max_sets=2).encode(split)


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


# ------------------------------------------------------------------------------ size of the space
def test_set_collections_by_hand():
    """Three accelerators that share a design: every tuple of disjoint runs in order (12);
    with at most two partition sets, those whose partition needs three are left out."""
    space = MappingSpace(GRAPH, make_system(3))
    got = set(set_collections(space))
    a0, a1, a2 = ("acc0",), ("acc1",), ("acc2",)
    expected = {(("acc0", "acc1", "acc2"),), (("acc0", "acc1"),), (("acc1", "acc2"),), (a0,), (a1,), (a2,),
                (a0, a1), (a0, a2), (a1, a2), (("acc0", "acc1"), a2), (a0, ("acc1", "acc2")), (a0, a1, a2)}
    assert got == expected
    narrow = MappingSpace(GRAPH, make_system(3), max_sets=2)
    # sets needed up to the last used one: (a2,) 2 (idle a0-a1 form one set), (a0, a2) 3,
    # (a1, a2) 3, (a0, a1, a2) 3
    assert set(set_collections(narrow)) == expected - {(a0, a2), (a1, a2), (a0, a1, a2)}


@pytest.mark.parametrize("system", [make_system(3, designs={"x": DESIGN, "y": {**DESIGN, "dataflow": "ws"}}), FIXED],
                         ids=["adaptive-3", "fixed-4"])
def test_count_space_is_the_number_of_distinct_mappings_of_all_genomes(system):
    """Brute force, independent of the enumeration: decode every genome of a tiny space (every
    cut, boundary set, assignment, design, strategy and micro-batch count) and count the
    distinct mappings; exhaustive enumerates exactly those."""
    from marssim.search.baselines import _enumerate

    b = GraphBuilder("three", batch=2)
    x = b.input("x", c=64)
    for i in range(3):
        x = b.linear(f"l{i}", x, 64)
    graph = b.build()
    space = MappingSpace(graph, system, micro_batch_choices=(1, 2), strategies=("none", "dp"))
    n_acc, n = len(space.accelerators), space.n_layers
    keys = set()
    for cuts in itertools.product((False, True), repeat=n_acc - 1):
        sets = space.decoded_sets(cuts)
        # decode clamps other values of these genes to the ones iterated here
        shardings = list(itertools.product(("none", "dp"), repeat=n)) if max(map(len, sets)) > 1 else [("none",) * n]
        for n_bounds in range(n):
            for bounds in itertools.combinations(range(1, n), n_bounds):
                for assign in itertools.product(range(len(sets)), repeat=n_bounds + 1):
                    for ds in itertools.product(*(space.allowed_designs(s) for s in sets)):
                        for micro in (1, 2):
                            for shard in shardings:
                                keys.add(space.decode(Genome(cuts, ds, bounds, micro, shard, assign)).key)
    assert count_space(space) == len(keys)
    assert {space.decode(g).key for g in _enumerate(space)} == keys
