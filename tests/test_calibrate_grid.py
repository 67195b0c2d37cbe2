"""The calibration shape grid: derived from the zoo's layers (keys recomputed here from the Op
API, not from the cost model's feature tuples), the sweep around them, deduplication,
determinism, and the time estimate's split into chunks. No GPU, no torch."""

from __future__ import annotations

from dataclasses import replace

import pytest

from marssim.calibrate.grid import (
    FUSED_ATTENTION, TimingPlan, build_grid, estimate_seconds, grid_from_graphs, parse_list, split_chunks,
    shard_variants, split_workloads, sweep_variants, tile_neighbours,
)
from marssim.errors import InputError
from marssim.cli import main
from marssim.workload import OpKind, load_workload

KIND_OF = {OpKind.CONV: "conv", OpKind.GEMM: "gemm", OpKind.MATMUL: "attention", OpKind.ELTWISE: "elementwise",
           OpKind.NORM: "norm", OpKind.SOFTMAX: "softmax", OpKind.POOL: "pool", OpKind.EMBEDDING: "embedding"}


def layer_geometry(op) -> tuple:
    """A whole conv layer's geometry as lookups compare it, from the Op API (symmetric
    padding): input and output channels, kernel, strides, padding, dilation, groups, output
    rows and columns."""
    n, c, h, w = op.in_shapes[0]
    top, left, bottom, right = op.param("pad")
    assert (top, left) == (bottom, right)
    groups = op.dim("K") if op.param("depthwise", False) else op.param("groups", 1)
    return (c, op.dim("K"), op.dim("R"), op.dim("S"), *op.param("stride"), top, left, op.param("dilation", 1),
            groups, op.dim("P"), op.dim("Q"))


def expected_key(op, dtype: str) -> tuple:
    """The lookup key of a layer, from the Op API: GEMM-like ops by their GEMM view (convolutions
    with their geometry), streaming ops by FLOPs and traffic (embeddings read only the gathered
    rows: ids + 2 x output)."""
    kind = KIND_OF[op.kind]
    if op.is_gemm_like:  # the zoo's layers are forward kernels: phase fwd, no fused attention backend
        return (kind, dtype, *op.gemm_view(), 0, 0, layer_geometry(op) if op.kind == OpKind.CONV else (), "fwd", "")
    traffic = op.input_bytes + 2 * op.output_bytes if op.kind == OpKind.EMBEDDING else op.bytes_moved
    return (kind, dtype, 0, 0, 0, 0, op.flops, traffic, (), "fwd", "")


def test_tile_neighbours_by_hand():
    assert tile_neighbours(768) == (512, 1024, 640, 896)
    assert tile_neighbours(200) == (128, 256)           # 128 is both a power of two and a tile below
    assert tile_neighbours(1) == (2, 128)
    assert tile_neighbours(64) == (32, 128)
    assert tile_neighbours(3072) == (2048, 4096, 2944, 3200)
    assert tile_neighbours(128) == (64, 256)


@pytest.mark.parametrize("workload", ["resnet50", "bert-base"])
def test_every_layer_of_the_workload_is_a_point_once(workload):
    graph = load_workload(workload)
    kinds = ("gemm", "conv", "attention", "elementwise", "norm", "softmax", "pool", "embedding")
    points = grid_from_graphs([graph], kinds, ("fp16", "fp32"), sweep=False)
    keys = [p.key for p in points]
    assert len(keys) == len(set(keys))
    expected = {expected_key(replace(op, dtype=dt), dt) for dt in ("fp16", "fp32") for op in graph.ops
                if op.kind not in (OpKind.INPUT, OpKind.RESHAPE)}
    assert set(keys) == expected
    for p in points:  # GEMM-class rows satisfy the table's flops = 2*batch*m*n*k
        if p.kind in ("gemm", "conv", "attention"):
            assert p.flops == 2 * p.batch * p.m * p.n * p.k


def test_resnet50_conv_shapes_and_dtype_bytes():
    graph = load_workload("resnet50")
    fp16 = grid_from_graphs([graph], ("conv",), ("fp16",), sweep=False)
    fp32 = grid_from_graphs([graph], ("conv",), ("fp32",), sweep=False)
    distinct = {(op.gemm_view(), layer_geometry(op)) for op in graph.ops if op.kind == OpKind.CONV}
    assert len({g for g, _ in distinct}) == 20
    assert len(fp16) == len(distinct) == 23  # 53 convs, 23 distinct convolutions with 20 distinct GEMMs
    conv1 = next(p for p in fp16 if p.origin.endswith(":conv1"))
    # 7x7/2 conv of 3x224x224 to 64x112x112: M = 112*112, N = 64, K = 3*7*7
    assert (conv1.batch, conv1.m, conv1.n, conv1.k) == (1, 112 * 112, 64, 147)
    assert conv1.bytes == 2 * (3 * 224 * 224 + 64 * 3 * 7 * 7 + 64 * 112 * 112)
    for a, b in zip(fp16, fp32):  # every tensor doubles in size from fp16 to fp32
        assert (a.m, a.n, a.k) == (b.m, b.n, b.k) and b.bytes == 2 * a.bytes


def test_sweep_scales_the_batch_and_probes_tiles():
    graph = load_workload("bert-base")
    query = graph.op("encoder.layer.0.attention.self.query")  # B=1 M=128 N=768 K=768
    variants = sweep_variants(query, max_batch_factor=8)
    labels = [label for _, label in variants]
    assert labels[:3] == ["x2 B", "x4 B", "x8 B"]
    for op, label in variants[:3]:
        assert op.gemm_view() == (1, 128 * int(label[1]), 768, 768)
    n_variants = [op.dim("N") for op, label in variants if label.startswith("N=")]
    assert n_variants == [512, 1024, 640, 896]
    conv = load_workload("resnet50").op("layer1.0.conv2")  # 3x3, 64 -> 64, 56x56
    cv = dict((label, op) for op, label in sweep_variants(conv, max_batch_factor=4))
    assert set(cv) == {"x2 N", "x4 N", "K=32", "K=128"}
    assert cv["x4 N"].gemm_view() == (1, 4 * 56 * 56, 64, 576)
    assert cv["K=128"].weight_elems == 128 * 64 * 9


def test_sweep_grid_is_deduplicated_deterministic_and_contains_the_base():
    a = build_grid(("resnet50", "bert-base"), ("gemm", "conv"), ("bf16",), max_batch_factor=8)
    b = build_grid(("resnet50", "bert-base"), ("gemm", "conv"), ("bf16",), max_batch_factor=8)
    assert [(p.key, p.origin) for p in a] == [(p.key, p.origin) for p in b]
    assert len({p.key for p in a}) == len(a)
    base = build_grid(("resnet50", "bert-base"), ("gemm", "conv"), ("bf16",), sweep=False)
    for kind in ("gemm", "conv"):  # per kind the layers' own shapes come first, then the sweep's
        own = [p.key for p in base if p.kind == kind]
        assert [p.key for p in a if p.kind == kind][:len(own)] == own
    assert {p.key for p in base} < {p.key for p in a}
    # the whole batch-8 layer is the x8 variant; its shard on one of 8 GPUs the batch-1 layer
    r8 = load_workload("resnet50:batch=8").op("layer2.0.downsample.0")  # 1x1 stride 2
    assert expected_key(r8, "bf16") in {p.key for p in a}
    assert expected_key(r8.with_loops(N=1), "bf16") in {p.key for p in base}


def test_fused_attention_points_follow_the_sip_convention():
    graph = load_workload("bert-base")
    points = grid_from_graphs([graph], (FUSED_ATTENTION,), ("fp16",), sweep=False)
    assert len(points) == 1  # every layer's block has the same shape
    p = points[0]
    # Z=1, H=12, N_CTX=128, HEAD_DIM=64: two GEMMs per head, Q, K, V read and O written once
    assert (p.kind, p.batch, p.m, p.n, p.k) == ("attention", 2 * 12, 128, 128, 64)
    assert p.bytes == 4 * 12 * 128 * 64 * 2 and p.fused
    both = grid_from_graphs([graph], ("attention", FUSED_ATTENTION), ("fp16",), sweep=False)
    assert {q.measure_kind for q in both} == {"attention", FUSED_ATTENTION}


def test_split_chunks_covers_in_order_within_budget():
    seconds = [3.0, 4.0, 2.0, 9.0, 12.0, 1.0, 1.0]
    chunks = split_chunks(seconds, 10.0)
    assert chunks == [(0, 3), (3, 4), (4, 5), (5, 7)]  # 12 s alone exceeds the budget: its own chunk
    assert [i for a, b in chunks for i in range(a, b)] == list(range(len(seconds)))
    for a, b in chunks:
        assert sum(seconds[a:b]) <= 10.0 or b - a == 1
    assert split_chunks([], 5.0) == []
    with pytest.raises(ValueError):
        split_chunks([1.0], 0)


def test_estimate_counts_flush_and_repetitions():
    graph = load_workload("bert-base")
    points = grid_from_graphs([graph], ("elementwise",), ("fp16",), sweep=False)
    plan = TimingPlan(warmup=0, min_reps=20, max_reps=20, setup_s=0.0, sync_s=0.0, flush_bytes=1 << 30)
    one = estimate_seconds(points, [1] * len(points), plan=plan)
    two = estimate_seconds(points, [2] * len(points), plan=plan)
    assert two == pytest.approx([2 * x for x in one])
    # tiny kernels: 20 repetitions of (L2 flush at 3.35 TB/s + a few microseconds)
    flush = 20 * (1 << 30) / 3.35e12
    assert all(flush < x < flush + 25 * 20e-6 for x in one)
    assert TimingPlan().reps(1e-6) == 100 and TimingPlan().reps(1.0) == 20


def test_flag_parsing_names_the_flag():
    assert parse_list("gemm, conv,gemm", ("gemm", "conv"), "--kinds") == ("gemm", "conv")
    with pytest.raises(InputError, match="--kinds: expected some of gemm, conv, got 'matmul'"):
        parse_list("gemm,matmul", ("gemm", "conv"), "--kinds")
    with pytest.raises(InputError, match="--dtype"):
        parse_list(" , ", ("fp16",), "--dtype")
    assert split_workloads("resnet50,bert-base:seq=512,batch=4,gpt2") == (
        "resnet50", "bert-base:seq=512,batch=4", "gpt2")
    with pytest.raises(InputError, match="no-such-model"):
        build_grid(("no-such-model",), ("gemm",), ("fp16",))
    pools = build_grid(("resnet50",), ("pool",), ("fp16",), sweep=False)
    assert [p.origin for p in pools] == ["resnet50:maxpool", "resnet50:avgpool"]


def test_shards_split_each_strategy_loop_into_the_sizes_a_mapping_uses():
    query = load_workload("bert-base").op("encoder.layer.0.attention.self.query")  # B=1 M=128 N=768 K=768
    views = {label: op.gemm_view() for op, label in shard_variants(query, (2, 3, 8))}
    # output channels (N), input channels (K) and tokens (M): 768 / 2, 3, 8 and 128 / 2, 3 (43 + 43 + 42), 8
    assert views == {
        "oc/2 N=384": (1, 128, 384, 768), "oc/3 N=256": (1, 128, 256, 768), "oc/8 N=96": (1, 128, 96, 768),
        "ic/2 K=384": (1, 128, 768, 384), "ic/3 K=256": (1, 128, 768, 256), "ic/8 K=96": (1, 128, 768, 96),
        "seq/2 M=64": (1, 64, 768, 768), "seq/3 M=43": (1, 43, 768, 768), "seq/3 M=42": (1, 42, 768, 768),
        "seq/8 M=16": (1, 16, 768, 768)}
    # a batch of 1 cannot be split: no batch shards
    conv = load_workload("resnet50").op("layer1.0.conv2")  # 3x3, 64 -> 64, 56x56 output
    spatial = [op for op, label in shard_variants(conv, (3,)) if label.startswith("spatial")]
    assert [op.gemm_view()[1] for op in spatial] == [19 * 56, 18 * 56]
    assert sum(op.flops for op in spatial) + 19 * 56 * 64 * 576 * 2 == conv.flops  # 19 + 19 + 18 rows


def test_shard_points_join_the_grid_after_the_sweep_and_are_unique():
    base = build_grid(("bert-base",), ("gemm",), ("bf16",), sweep=False)
    sharded = build_grid(("bert-base",), ("gemm",), ("bf16",), sweep=False, shards=(2, 8))
    assert [p.key for p in sharded][:len(base)] == [p.key for p in base]
    assert len({p.key for p in sharded}) == len(sharded) > len(base)
    query = load_workload("bert-base").op("encoder.layer.0.attention.self.query")
    assert expected_key(query.with_loops(N=96), "bf16") in {p.key for p in sharded}


def test_shards_flag_is_checked(capsys):
    assert main(["calibrate", "grid", "--workloads", "bert-base", "--kinds", "gemm", "--no-sweep",
                 "--shards", "2,1"]) == 2
    assert "--shards" in capsys.readouterr().err
