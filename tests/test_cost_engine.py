"""The cost engine: scalar and vectorised paths agree bit for bit on every shipped design;
memoisation by shape; pickling; non-GEMM ops; lowering uses it."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from pathlib import Path

from marssim.cost import CalibratedCost, CostModel, DataflowCost, default_cost_model, load_table
from marssim.system import Design, load_system
from marssim.workload import GraphBuilder

SYSTEMS = ("mars-adaptive-16", "herald-soc", "dgx-h100", "ring-8", "chiplet-mesh-4x4")
TABLE = Path(__file__).parent / "data" / "calibration" / "synthetic-h100.csv"


def shipped_designs() -> list[Design]:
    out = []
    for name in SYSTEMS:
        system = load_system(name)
        for design in system.designs:
            host = next(a.id for a in system.accelerators if design in a.designs)
            out.append(system.design(host, design))
    return out


def mixed_graph(batch: int = 2, dtype: str = "fp16"):
    """Convs (plain, strided, depthwise, grouped), a transformer block and every non-GEMM kind."""
    b = GraphBuilder("mixed", batch=batch, dtype=dtype)
    x = b.input("img", c=3, h=64, w=64)
    y = b.conv("c1", x, 32, 3, stride=2)
    y = b.norm("bn1", y)
    y = b.eltwise("relu1", y, fn="relu")
    y = b.conv("dw", y, 32, 3, groups=32)
    y = b.conv("grp", y, 64, 3, groups=4)
    y = b.pool("pool", y, 2)
    y = b.conv("pw", y, 128, 1)
    y = b.global_pool("gap", y)
    y = b.flatten("flat", y)
    b.linear("fc", y, 1000)
    ids = b.input("ids", c=1, h=32)
    t = b.embedding("emb", ids, vocab=30522, hidden=256)
    t = b.norm("ln", t, norm="layer")
    q = b.linear("q", t, 256)
    k = b.linear("k", t, 256)
    v = b.linear("v", t, 256)
    s = b.matmul("qk", q, k, heads=4)
    p = b.softmax("sm", s, heads=4)
    o = b.matmul("pv", p, v, heads=4, b_feature="N")
    o = b.reshape("merge", o, shape=o.shape, what="transpose")
    o = b.linear("proj", o, 256)
    b.eltwise("res", o, t, fn="add")
    return b.build()


def shards_of(graph):
    """The ops plus shards along their first and last loop dims (as lowering would make)."""
    out = []
    for op in graph.ops:
        out.append(op)
        for dim, size in (op.loops[0], op.loops[-1]):
            if size >= 3 and not (op.kind.value == "reshape" and dim != "N"):
                out.append(op.with_loops(**{dim: size // 3}))
    return out


def test_is_a_cost_model():
    assert isinstance(default_cost_model(), CostModel)


@pytest.mark.filterwarnings("ignore::marssim.errors.InputWarning")  # the shipped GPU design's table is not here
@pytest.mark.parametrize("calibrated", [False, True])
def test_vectorised_equals_scalar_bit_for_bit(calibrated):
    designs = shipped_designs()
    if calibrated:
        gpu = next(d for d in designs if d.dataflow == "gpu")
        designs.append(gpu.model_copy(update={"gpu": gpu.gpu.model_copy(update={"calibration": "synthetic-H100"})}))
    model = DataflowCost(calibration=load_table(TABLE) if calibrated else None, allow_uncalibrated=True)
    ops = shards_of(mixed_graph()) + shards_of(mixed_graph(batch=1, dtype="bf16"))
    # pairs: every op with every design, shuffled; then a pair list longer than ops x designs
    rng = np.random.default_rng(0)
    pairs = [(o, d) for o in ops for d in designs]
    order = rng.permutation(len(pairs))
    ops_list = [pairs[i][0] for i in order]
    des_list = [pairs[i][1] for i in order]
    scalar_model = DataflowCost(calibration=load_table(TABLE) if calibrated else None, allow_uncalibrated=True)
    expected = np.array([scalar_model.op_time(o, d) for o, d in zip(ops_list, des_list)])
    got = model.op_times(ops_list, des_list)           # per-design groups (no repeats)
    assert np.array_equal(got, expected)
    doubled = model.op_times(ops_list * 2, des_list * 2)  # repeats: cross table of distinct pairs
    assert np.array_equal(doubled, np.concatenate([expected, expected]))
    table = model.op_time_table(ops, designs)
    assert np.array_equal(table, np.array([[scalar_model.op_time(o, d) for d in designs] for o in ops]))
    if calibrated:
        assert any(scalar_model.op_cost(o, designs[-1]).model == "fitted" for o in ops)


def test_memo_by_shape():
    model = DataflowCost()
    d = shipped_designs()[0]
    g1 = mixed_graph()
    g2 = mixed_graph()  # equal ops, different objects
    a = model.op_cost(g1.op("pw"), d)
    assert model.op_cost(g2.op("pw"), d) is a            # same shape, same design: memo hit
    renamed = g1.op("pw").__class__(**{**{f: getattr(g1.op("pw"), f) for f in
                                          ("kind", "loops", "inputs", "in_shapes", "out_shape", "params",
                                           "weight_elems", "dtype", "model")}, "name": "other"})
    assert model.op_cost(renamed, d) is a                # shapes, not names
    same_design = d.model_copy()
    assert model.op_cost(g1.op("pw"), same_design) is a  # equal design values
    size = model.cache_size
    model.op_cost(g1.op("pw").with_loops(N=1), d)
    assert model.cache_size == size + 1


def test_pickle_drops_caches_and_keeps_results():
    model = default_cost_model()
    d = shipped_designs()[2]
    op = mixed_graph().op("fc")
    t = model.op_time(op, d)
    clone = pickle.loads(pickle.dumps(model))
    assert clone.cache_size == 0
    assert clone.op_time(op, d) == t
    assert len(pickle.dumps(model)) < 2000


def test_non_gemm_ops_are_bandwidth_bound():
    d = Design(name="a", dataflow="os", pe_rows=16, pe_cols=16, clock=1e9, sram=1 << 20, sram_bandwidth=100e9,
               dram_bandwidth=10e9, energy={"mac": 1e-12, "sram_byte": 2e-12, "dram_byte": 20e-12})
    g = mixed_graph()
    model = DataflowCost()
    for name in ("bn1", "relu1", "pool", "gap", "ln", "sm", "res", "merge"):
        op = g.op(name)
        cost = model.op_cost(op, d)
        assert cost.model == "bandwidth"
        compute = math.ceil(op.flops / 256) / 1e9
        assert cost.time == pytest.approx(max(compute, op.bytes_moved / 10e9), rel=1e-15)
        # every byte is read from DRAM or written to it once, and crosses the buffer twice (a
        # fill or a write by the array, then a read by the array or a drain)
        energy = op.flops * 0.5e-12 + op.bytes_moved * (2 * 2e-12 + 20e-12)
        assert cost.energy == pytest.approx(energy, rel=1e-12)
    # an embedding reads the gathered rows, not its whole table
    emb = g.op("emb")
    assert model.op_cost(emb, d).time == pytest.approx((emb.input_bytes + 2 * emb.output_bytes) / 10e9, rel=1e-15)
    assert model.op_cost(g.op("img"), d).time == 0.0


def test_lowering_times_shards_with_the_default_model():
    """Data-parallel over 4 accelerators: each compute task lasts what the default model says
    for its quarter of the batch."""
    from marssim.lower import lower
    from marssim.mapping import Mapping
    from marssim.taskgraph import COMPUTE

    system = load_system("mars-adaptive-16")
    b = GraphBuilder("small", batch=8)
    x = b.input("x", c=16, h=16, w=16)
    y = b.conv("c", x, 32, 3)
    b.eltwise("r", y, fn="relu")
    graph = b.build()
    devices = ("acc0", "acc1", "acc2", "acc3")
    mapping = Mapping.single_set(graph, system, devices=devices, design="ws32", sharding=("dp",))
    tg = lower(graph, system, mapping)
    model = default_cost_model()
    design = system.design("acc0", "ws32")
    expected = sorted(model.op_time(graph.op(name).with_loops(N=2), design) for name in ("c", "r") for _ in devices)
    assert sorted(tg.duration[tg.kind == COMPUTE].tolist()) == expected


def test_calibrated_cost_rejects_non_gpu_designs():
    with pytest.raises(ValueError, match="dataflow"):
        CalibratedCost(load_table(TABLE)).op_time(mixed_graph().op("fc"), shipped_designs()[0])


def test_array_ids_grow_and_stay_exact():
    """Shapes interned over several calls (the feature matrix grows in place) still give the
    scalar results; equal shapes share an id; foreign ids are refused."""
    designs = shipped_designs()
    ops = shards_of(mixed_graph())
    model, scalar = DataflowCost(), DataflowCost()
    for chunk in (ops[:5], ops[:20], ops):
        got = model.op_times(chunk, [designs[1]] * len(chunk))
        assert np.array_equal(got, [scalar.op_time(o, designs[1]) for o in chunk])
    again = mixed_graph()
    assert np.array_equal(model.shape_ids(list(again.ops)), model.shape_ids(list(mixed_graph().ops)))
    with pytest.raises(ValueError, match="unknown shape or design id"):
        model.times(np.array([10**6]), np.array([0]))
    with pytest.raises(ValueError, match="as many"):
        model.op_times(ops[:2], designs[:1])


def test_simulated_energy_per_op_is_the_cost_models_compute_sram_dram():
    """A mapping of every op whole on one accelerator: the simulation's per-op energy is the cost
    model's, and that is compute + SRAM + DRAM."""
    from marssim.lower import lower
    from marssim.mapping import Mapping
    from marssim.sim import simulate

    system = load_system("herald-soc")
    graph = mixed_graph(batch=1)
    model = default_cost_model()
    mapping = Mapping.single_set(graph, system, devices=("nvdla0",), design="nvdla64", sharding="dp")
    result = simulate(lower(graph, system, mapping, model), system)
    design = system.design("nvdla0", "nvdla64")
    checked = 0
    for name, row in result.ops.iterrows():
        cost = model.op_cost(graph.op(name), design)
        assert row["compute_energy_j"] == pytest.approx(cost.energy, rel=1e-12)
        assert cost.energy == pytest.approx(cost.energy_compute + cost.energy_sram + cost.energy_dram, rel=1e-12)
        checked += cost.energy_dram > 0 and cost.energy_sram > 0
    assert checked > 10


def test_each_dataflow_name_has_its_formula_family():
    """A design's dataflow name maps to the :class:`Dataflow` the formulas branch on, in the
    order of ``DATAFLOWS``; the systolic ones are exactly ``SYSTOLIC_DATAFLOWS``; the shipped
    designs' parameters carry it, and a GPU design's is ``Dataflow.GPU``."""
    from marssim.cost.features import DATAFLOW_CODES, Dataflow, DesignParams
    from marssim.system.design import DATAFLOWS, SYSTOLIC_DATAFLOWS

    assert tuple(DATAFLOW_CODES) == DATAFLOWS
    assert [int(DATAFLOW_CODES[name]) for name in DATAFLOWS] == list(range(len(DATAFLOWS)))
    assert {name for name, d in DATAFLOW_CODES.items() if d.systolic} == set(SYSTOLIC_DATAFLOWS)
    for design in shipped_designs():
        code = DesignParams(design).code
        assert code is DATAFLOW_CODES[design.dataflow]
        assert (code is Dataflow.GPU) == (design.dataflow == "gpu")
