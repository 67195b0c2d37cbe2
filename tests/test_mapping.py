"""Shardings conserve work and data; lowering emits exactly the communication each strategy
implies; mappings round-trip through YAML; bad mappings get precise errors."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import yaml

from marssim.errors import InputError
from marssim.lower import lower
from marssim.mapping import (
    AcceleratorSet, Mapping, legal_strategies, load_mapping, mapping_from_dict, save_mapping, shard_regions,
    split_dim, split_sizes,
)
from marssim.mapping.sharding import box_elems, full_box, intersect
from marssim.system import system_from_dict
from marssim.sim import simulate
from marssim.taskgraph import TRANSFER
from marssim.workload import GraphBuilder
from support import DESIGN, RooflineCost, make_system

COUNTS = (2, 3, 4, 8, 16)


def _op_zoo():
    """One graph holding an op of every kind and flavour."""
    b = GraphBuilder("kinds", batch=4)
    img = b.input("img", c=32, h=30, w=30)
    c1 = b.conv("conv", img, 48, kernel=3, stride=1, pad=1, bias=True)
    c2 = b.conv("conv_s2", c1, 64, kernel=5, stride=2, pad=2)
    dw = b.conv("dwconv", c2, 64, kernel=3, stride=1, pad=1, groups=64)
    gr = b.conv("grouped", dw, 64, kernel=1, groups=4)
    bn = b.norm("bn", gr, norm="batch")
    act = b.eltwise("relu", bn, fn="relu")
    pool = b.pool("maxpool", act, kernel=3, stride=2, pad=1)
    gp = b.global_pool("gap", pool)
    fc = b.linear("fc", gp, 10)
    tok = b.input("tokens", c=1, h=24)
    emb = b.embedding("embed", tok, vocab=1000, hidden=96)
    ln = b.norm("ln", emb, norm="layer")
    q = b.linear("q", ln, 96)
    k = b.linear("k", ln, 96)
    v = b.linear("v", ln, 96)
    s = b.matmul("qk", q, k, heads=6, b_feature="K")
    p = b.softmax("softmax", s, heads=6)
    o = b.matmul("pv", p, v, heads=6, b_feature="N")
    add = b.eltwise("residual", o, ln, fn="add")
    flat = b.flatten("flatten", c2)
    b.linear("head", flat, 5, bias=False)
    return b.build(), (fc, add)


GRAPH, _ = _op_zoo()
COMPUTE_OPS = [GRAPH.ops[i] for i in GRAPH.compute_ops]


@pytest.mark.parametrize("op", COMPUTE_OPS, ids=lambda o: o.name)
@pytest.mark.parametrize("n", COUNTS)
def test_every_sharding_conserves_flops_and_covers_the_output(op, n):
    for strategy in legal_strategies(op):
        dim = split_dim(op, strategy)
        if dim is None:
            continue
        sizes = split_sizes(op.dim(dim), n)
        assert sum(sizes) == op.dim(dim) and max(sizes) - min(sizes) <= 1
        flops, outs, partial = 0, [], False
        lo = 0
        for size in sizes:
            if size:
                shard = op.with_loops(**{dim: size})
                flops += shard.flops
                out, ins, partial = shard_regions(op, dim, lo, lo + size)
                outs.append(out)
                assert len(ins) == len(op.inputs)
                for box, shape in zip(ins, op.in_shapes):
                    assert all(0 <= a <= b_ <= s for (a, b_), s in zip(box, shape))
            lo += size
        assert flops == op.flops, (op.name, strategy, n)
        total = op.out_elems
        if partial:
            assert all(out == full_box(op.out_shape) for out in outs)
        else:
            assert sum(box_elems(o) for o in outs) == total
            for a, b in itertools.combinations(outs, 2):
                assert intersect(a, b) is None


@pytest.mark.parametrize("n", COUNTS)
def test_weights_are_split_or_replicated_as_declared(n):
    for op in COMPUTE_OPS:
        bias = op.out_shape[1] if op.param("bias", False) else 0
        for strategy in legal_strategies(op):
            dim = split_dim(op, strategy)
            if dim is None:
                continue
            shards = [op.with_loops(**{dim: s}) for s in split_sizes(op.dim(dim), n) if s]
            total = sum(s.weight_bytes for s in shards) // op.dtype_bytes
            if strategy in ("dp", "spatial", "seq", "head") or op.weight_elems == 0:
                assert total == len(shards) * op.weight_elems
            elif strategy == "ic":  # the bias is applied by every partial-sum shard
                assert total == op.weight_elems + (len(shards) - 1) * bias
            else:
                assert total == op.weight_elems, (op.name, strategy)


# ---------------------------------------------------------------------------------- lowering
def _chain(kind_a: str, kind_b: str):
    """input -> A -> B, shapes chosen so that every split below is even for N up to 16."""
    b = GraphBuilder("pair", batch=16)
    if kind_a == "conv":
        x = b.input("x", c=16, h=64, w=32)
        a = b.conv("A", x, 32, kernel=3, pad=1)
        b.conv("B", a, 32, kernel=3, pad=1)
    elif kind_a == "attn":
        x = b.input("x", c=256, h=32)
        q = b.linear("q", x, 256)
        s = b.matmul("A", q, q, heads=16, b_feature="K")
        p = b.softmax("B", s, heads=16)
        b.matmul("C", p, q, heads=16, b_feature="N")
    else:
        x = b.input("x", c=256, h=32)
        a = b.linear("A", x, 256 * 3)
        if kind_b == "eltwise":
            b.eltwise("B", a, fn="gelu")
        else:
            b.linear("B", a, 256)
    return b.build()


def _transfers(tg, op_name, kind=None):
    """Transfers between accelerators (not to or from the host) made for ``op_name``'s inputs."""
    host = tg.node_names.index("host0")
    mask = ((tg.kind == TRANSFER) & (np.asarray(tg.op_names + ("",))[tg.op] == op_name)
            & (tg.src != host) & (tg.dst != host))
    idx = np.flatnonzero(mask)
    if kind is not None:
        idx = [t for t in idx if tg.collectives[tg.collective[t]].kind == kind]
    return list(idx)


def _lower(graph, system, shardings, algo="ring", micro=1):
    shard = tuple(shardings[graph.ops[i].name] for i in graph.compute_ops)
    m = Mapping(sets=(AcceleratorSet(system.accelerator_ids, "os16"),), op_set=(0,) * len(shard),
                op_sharding=shard, collective_algorithm=algo, micro_batches=micro)
    return lower(graph, system, m, RooflineCost())


@pytest.mark.parametrize("n", COUNTS)
def test_oc_then_full_input_is_a_ring_all_gather(n):
    g = _chain("gemm", "gemm")
    tg = _lower(g, make_system(n), {"A": "oc", "B": "oc"})
    moves = _transfers(tg, "B")
    out_bytes = g.op("A").output_bytes
    assert len(moves) == n * (n - 1)
    assert {tg.collectives[tg.collective[t]].kind for t in moves} == {"all_gather"}
    assert np.allclose(tg.nbytes[moves], out_bytes / n)
    coll = tg.collectives[tg.collective[moves[0]]]
    assert coll.algorithm == "ring" and coll.steps == n - 1


@pytest.mark.parametrize("n", COUNTS)
def test_ic_partial_sums_are_all_reduced_for_a_full_consumer(n):
    g = _chain("gemm", "gemm")
    tg = _lower(g, make_system(n), {"A": "ic", "B": "oc"})
    moves = _transfers(tg, "B")
    assert len(moves) == 2 * n * (n - 1)
    assert np.allclose(tg.nbytes[moves], g.op("A").output_bytes / n)
    coll = tg.collectives[tg.collective[moves[0]]]
    assert (coll.kind, coll.steps) == ("all_reduce", 2 * (n - 1))


@pytest.mark.parametrize("n", COUNTS)
def test_ic_partial_sums_are_reduce_scattered_for_a_split_consumer(n):
    g = _chain("gemm", "eltwise")
    tg = _lower(g, make_system(n), {"A": "ic", "B": "oc"})
    moves = _transfers(tg, "B")
    assert len(moves) == n * (n - 1)
    assert {tg.collectives[tg.collective[t]].kind for t in moves} == {"reduce_scatter"}


@pytest.mark.parametrize("n", COUNTS)
def test_matching_layouts_move_nothing(n):
    g = _chain("gemm", "eltwise")
    for a, b in (("dp", "dp"), ("oc", "oc"), ("seq", "seq")):
        tg = _lower(g, make_system(n), {"A": a, "B": b})
        assert _transfers(tg, "B") == [], (a, b)
    att = _chain("attn", None)
    tg = _lower(att, make_system(n), {"q": "oc", "A": "head", "B": "head", "C": "head"})
    assert _transfers(tg, "B") == [] and _transfers(tg, "C") == []


@pytest.mark.parametrize("n", COUNTS)
def test_spatial_convs_exchange_halos_with_neighbours(n):
    g = _chain("conv", None)
    tg = _lower(g, make_system(n), {"A": "spatial", "B": "spatial"})
    moves = _transfers(tg, "B")
    a = g.op("A")
    row = a.out_shape[0] * a.out_shape[1] * a.out_shape[3] * a.dtype_bytes  # one output row of A
    assert len(moves) == 2 * (n - 1)
    assert np.allclose(tg.nbytes[moves], row)
    for t in moves:  # only between neighbouring shards
        s, d = tg.node_names[tg.src[t]], tg.node_names[tg.dst[t]]
        assert abs(int(s[3:]) - int(d[3:])) == 1
        assert tg.collectives[tg.collective[t]].kind == "halo"


@pytest.mark.parametrize("n", (2, 4, 8, 16))
def test_halving_doubling_and_direct_step_counts(n):
    g = _chain("gemm", "gemm")
    hd = _lower(g, make_system(n, topology="switch"), {"A": "ic", "B": "oc"}, algo="halving_doubling")
    moves = _transfers(hd, "B")
    steps = int(np.log2(n))
    assert len(moves) == 2 * steps * n
    assert hd.collectives[hd.collective[moves[0]]].steps == 2 * steps
    direct = _lower(g, make_system(n, topology="switch"), {"A": "ic", "B": "oc"}, algo="direct")
    assert len(_transfers(direct, "B")) == 2 * n * (n - 1)


def test_auto_algorithm_choice_is_recorded_and_no_worse_than_ring():
    from marssim.sim import simulate

    g = _chain("gemm", "gemm")
    system = make_system(8, topology="switch", bandwidth="100 GB/s", latency="2 us")
    auto = _lower(g, system, {"A": "ic", "B": "oc"}, algo="auto")
    ring = _lower(g, system, {"A": "ic", "B": "oc"}, algo="ring")
    chosen = {c.algorithm for c in auto.collectives if c.kind == "all_reduce"}
    assert chosen and chosen <= {"ring", "halving_doubling", "direct"}
    assert simulate(auto, system).makespan <= simulate(ring, system).makespan * (1 + 1e-9)


def test_pipeline_micro_batches_split_the_batch_and_conserve_flops():
    g = _chain("gemm", "gemm")
    system = make_system(4)
    sets = (AcceleratorSet(("acc0", "acc1"), "os16"), AcceleratorSet(("acc2", "acc3"), "os16"))
    for micro in (1, 2, 3, 16):
        m = Mapping(sets=sets, op_set=(0, 1), op_sharding=("dp", "oc"), micro_batches=micro)
        tg = lower(g, system, m, RooflineCost())
        assert tg.total_flops == pytest.approx(g.flops)
        assert set(tg.micro_batch.tolist()) == set(range(micro))


def test_host_streams_input_micro_batches_one_after_another():
    # Micro-batch m of the input leaves the host once micro-batch m-1 has been sent, so the first
    # stage starts after one micro-batch's transfer, not after all of them shared the host link.
    g = _chain("gemm", "gemm")
    system = make_system(4, host_bandwidth="10 GB/s", latency="1 us")
    sets = (AcceleratorSet(("acc0",), "os16"), AcceleratorSet(("acc1",), "os16"))
    micro = 4
    m = Mapping(sets=sets, op_set=(0, 1), op_sharding=("none", "none"), micro_batches=micro)
    tg = lower(g, system, m, RooflineCost())
    host = system.node_index["host0"]
    inputs = [t for t in range(tg.n_tasks) if tg.kind[t] == TRANSFER and tg.src[t] == host]
    assert [int(tg.micro_batch[t]) for t in inputs] == list(range(micro))
    for earlier, later in zip(inputs, inputs[1:]):
        assert earlier in tg.preds(later).tolist()
    r = simulate(tg, system, setup=False).intervals.set_index("task")
    size = g.ops[0].output_bytes / micro
    route = system.route("host0", "acc0")
    first = route.latency + size / system.bottleneck_bandwidth("host0", "acc0")
    assert r.loc[inputs[0], "end"] == pytest.approx(first, rel=1e-12)
    ends = [r.loc[t, "end"] for t in inputs]
    assert ends == sorted(ends) and all(b - a >= size / 10e9 * (1 - 1e-12) for a, b in zip(ends, ends[1:]))


def test_lowering_is_acyclic_and_deterministic():
    system = make_system(4)
    strategies = {}
    for i in GRAPH.compute_ops:
        op = GRAPH.ops[i]
        legal = legal_strategies(op)
        strategies[op.name] = legal[(i * 7) % len(legal)]
    sets = (AcceleratorSet(("acc0", "acc1", "acc2"), "os16"), AcceleratorSet(("acc3",), "os16"))
    op_set = tuple(0 if k < len(GRAPH.compute_ops) // 2 else 1 for k in range(len(GRAPH.compute_ops)))
    m = Mapping(sets=sets, op_set=op_set, op_sharding=tuple(strategies[GRAPH.ops[i].name] for i in GRAPH.compute_ops),
                micro_batches=2)
    a = lower(GRAPH, system, m, RooflineCost())
    b = lower(GRAPH, system, m, RooflineCost())
    assert len(a.topological_order) == a.n_tasks
    for name in ("kind", "device", "duration", "src", "dst", "nbytes", "pred_ptr", "pred_idx", "priority"):
        assert np.array_equal(getattr(a, name), getattr(b, name)), name
    assert a.total_flops == pytest.approx(GRAPH.flops * 1.0)
    for t in range(a.n_tasks):  # predecessors always come first
        assert all(p < t for p in a.preds(t))


# ---------------------------------------------------------------------------------- files
def _two_set_mapping(system):
    names = [GRAPH.ops[i].name for i in GRAPH.compute_ops]
    half = len(names) // 2
    data = {
        "system": "test", "workload": "kinds", "micro_batches": 2, "collective_algorithm": "ring",
        "sets": [{"name": "left", "devices": "acc[0-2]", "design": "os16"},
                 {"name": "right", "devices": ["acc3"], "design": "os16"}],
        "assign": [{"ops": f"{names[0]} .. {names[half - 1]}", "set": "left", "sharding": ["oc", "dp"]},
                   {"ops": f"{names[half]} .. {names[-1]}", "set": 1, "sharding": "dp"}],
        "sharding": {"conv": "spatial"},
    }
    return data


def test_mapping_yaml_round_trip(tmp_path):
    system = make_system(4)
    data = _two_set_mapping(system)
    m1 = mapping_from_dict(data, GRAPH, system, "m.yaml")
    assert m1.op_sharding[0] == "spatial"
    p1 = save_mapping(m1, GRAPH, tmp_path / "a.yaml")
    m2 = mapping_from_dict(yaml.safe_load(p1.read_text()), GRAPH, system, str(p1))
    assert m2 == m1 and m2.key == m1.key
    p2 = save_mapping(m2, GRAPH, tmp_path / "b.yaml")
    assert p1.read_text() == p2.read_text()


def test_mapping_file_names_its_system_and_workload(tmp_path):
    system_file = tmp_path / "sys.yaml"
    system_file.write_text(yaml.safe_dump({
        "name": "tiny", "designs": {"os16": DESIGN},
        "accelerators": [{"id": "acc[0-1]", "design": "os16", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "8 GiB", "bandwidth": "50 GB/s"}}],
        "links": [{"pattern": "chain", "nodes": "acc[0-1]", "bandwidth": "10 GB/s"},
                  {"between": ["host0", "acc0"], "bandwidth": "10 GB/s"}]}))
    sub = tmp_path / "maps"
    sub.mkdir()
    mfile = sub / "m.yaml"
    mfile.write_text(yaml.safe_dump({"system": "../sys.yaml", "workload": "zoo-free", "sets": [
        {"devices": ["acc0", "acc1"], "design": "os16"}], "assign": [{"ops": "*", "set": 0}]}))
    m, graph, system = load_mapping(mfile, workload=GRAPH)
    assert system.name == "tiny" and graph is GRAPH
    assert set(m.op_sharding) == {"dp"}
    out = save_mapping(m, graph, tmp_path / "elsewhere" / "copy.yaml")
    again, _, system2 = load_mapping(out, workload=GRAPH)
    assert system2.name == "tiny" and again == m


RESTRICTED = system_from_dict({
    "name": "restricted", "designs": {"os16": DESIGN, "ws16": {**DESIGN, "dataflow": "ws"}},
    "accelerators": [
        {"id": "acc[0-1]", "designs": ["os16", "ws16"], "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}},
        {"id": "acc[2-3]", "design": "os16", "memory": {"capacity": "1 GiB", "bandwidth": "100 GB/s"}}],
    "hosts": [{"id": "host0", "dram": {"capacity": "8 GiB", "bandwidth": "50 GB/s"}}],
    "links": [{"pattern": "ring", "nodes": "acc[0-3]", "bandwidth": "10 GB/s"},
              {"between": ["host0", "acc0"], "bandwidth": "10 GB/s"}]}, "<restricted>")


def _bad(change):
    data = _two_set_mapping(RESTRICTED)
    change(data)
    with pytest.raises(InputError) as info:
        mapping_from_dict(data, GRAPH, RESTRICTED, "bad.yaml")
    return str(info.value)


FIRST, LAST = GRAPH.ops[GRAPH.compute_ops[0]].name, GRAPH.ops[GRAPH.compute_ops[-1]].name


@pytest.mark.parametrize("change,path,words", [
    (lambda d: d["sets"][0].update(devices=["acc0", "acc9"]), "sets[0].devices", "unknown device 'acc9'"),
    (lambda d: d["sets"][1].update(devices=["acc3"], design="ws16"), "sets[1].design", "not allowed on acc3"),
    (lambda d: d["sets"][0].update(design="tpu"), "sets[0].design", "unknown design 'tpu'"),
    (lambda d: d["sets"][1].update(devices=["acc2"]), "sets[1].devices", "acc2 already in sets[0]"),
    (lambda d: d["assign"].append({"ops": FIRST, "set": 1}), "assign[2].ops", f"op '{FIRST}' is already assigned"),
    (lambda d: d["assign"].pop(), "assign", "ops are not assigned"),
    (lambda d: d.update(sharding={"relu": "ic"}), "sharding.relu", "expected one of"),
    (lambda d: d["assign"][1].update(sharding="head"), "assign[1].sharding", "sharding 'head' is illegal for"),
    (lambda d: d["assign"][1].update(set="middle"), "assign[1].set", "unknown set 'middle'"),
    (lambda d: d["assign"][0].update(ops=f"{LAST} .. {FIRST}"), "assign[0].ops", "ends before it starts"),
    (lambda d: d["assign"][0].update(ops="conv99"), "assign[0].ops", "unknown op 'conv99'"),
    (lambda d: d.update(micro_batches=64), "micro_batches", "at most the batch"),
    (lambda d: d.update(collective_algorithm="butterfly"), "collective_algorithm", "butterfly"),
    (lambda d: d.update(stages=3), "stages", "unknown key"),
])
def test_malformed_mappings_get_precise_errors(change, path, words):
    message = _bad(change)
    assert message.startswith("bad.yaml: ")
    assert f"bad.yaml: {path}: " in message, message
    assert words in message, message
