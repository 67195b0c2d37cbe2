"""A fused attention backward kernel timed from its measured forward twin: the published ratio
in closed form at its points and between them, the cost model's derived time on the shipped
H100/H200/B200 tables (scalar and vectorised alike), and a fused kernel's phase never relaxed
to a forward row of another shape."""

from __future__ import annotations

import math

import pytest

from marssim.cost import default_cost_model
from marssim.cost.attention_backward import BACKWARD_FLOP_RATIO, FA3_H100_BF16, backward_ratio
from marssim.cost.calibrated import lookup_keys, shape_key
from marssim.serve import load_model
from marssim.system import load_system
from marssim.workload.llm import build_transformer
from marssim.workload.llm.config import with_overrides


@pytest.mark.parametrize("head_dim", sorted(FA3_H100_BF16))
def test_the_ratio_is_the_published_forward_over_backward_rate_at_each_point(head_dim):
    for seq, (fwd, bwd) in FA3_H100_BF16[head_dim].items():
        assert backward_ratio(head_dim, seq) == pytest.approx(BACKWARD_FLOP_RATIO * fwd / bwd, rel=1e-12)


def test_the_ratio_between_points_is_linear_in_log_length_and_constant_outside():
    row = FA3_H100_BF16[128]
    r = {s: BACKWARD_FLOP_RATIO * f / b for s, (f, b) in row.items()}
    mid = int(round(math.sqrt(2048 * 4096)))  # halfway in ln s
    u = (math.log(mid) - math.log(2048)) / math.log(2)
    assert backward_ratio(128, mid) == pytest.approx((1 - u) * r[2048] + u * r[4096], rel=1e-12)
    assert backward_ratio(128, 64) == r[512] and backward_ratio(128, 1 << 20) == r[16384]
    d = 96  # between the two head dimensions, linear in ln d
    w = (math.log(96) - math.log(64)) / (math.log(128) - math.log(64))
    assert backward_ratio(d, 4096) == pytest.approx((1 - w) * backward_ratio(64, 4096) + w * r[4096], rel=1e-12)
    with pytest.raises(ValueError):
        backward_ratio(0, 4096)


def _attention_ops(seq: int):
    """Llama 3 8B's fused attention of one training layer at ``seq`` tokens: forward, backward."""
    cfg = with_overrides(load_model("llama3-8b"), mode="train", seq=seq, batch=1, layers=1, attention="flash")
    graph = build_transformer(cfg)
    return graph.op("layers.0.attn.core"), graph.op("layers.0.attn.core.grad")


@pytest.mark.parametrize("system", ["dgx-h100-cluster:nodes=1", "dgx-h200-cluster:nodes=1", "dgx-b200-cluster:nodes=1"])
@pytest.mark.parametrize("seq", [4096, 3000])
def test_the_backward_is_its_forward_twin_times_the_ratio(system, seq):
    """The forward op has the backward's queries, keys, heads and head dimension, so its time
    (measured on the grid, interpolated off it) is the twin's."""
    design = next(iter(load_system(system).designs.values()))
    model = default_cost_model()
    fwd, bwd = _attention_ops(seq)
    f, b = model.op_cost(fwd, design), model.op_cost(bwd, design)
    assert f.model == ("measured" if seq == 4096 else "interpolated")
    assert b.model == "derived"
    assert b.time == pytest.approx(f.time * backward_ratio(128, seq), rel=1e-12)
    assert model.op_times([bwd, fwd], [design, design]).tolist() == [b.time, f.time]


def test_a_fused_kernel_keeps_its_phase_while_a_gradient_gemm_takes_the_forward_row():
    fused = shape_key("attention", "bf16", 256, 4096, 4096, 128, 0.0, 0.0, phase="bwd", backend="flash")
    assert all(k[9] == "bwd" for k in lookup_keys(fused))
    gemm = shape_key("gemm", "bf16", 1, 4096, 4096, 4096, 0.0, 0.0, phase="dgrad")
    assert [k[9] for k in lookup_keys(gemm)] == ["dgrad", "fwd"]


def test_a_context_kernel_past_the_grid_grows_as_its_square_and_a_short_decode_line_is_not_extrapolated():
    from marssim.cost.attention_grid import SATURATED_KEYS, AttentionFamily, AttentionGrid, SliceKey

    ctx = SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.CONTEXT, 1, 16)
    dec = SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.DECODE, 1, 16)
    short = SliceKey("bf16", "fwd", "flash", 64, AttentionFamily.CONTEXT, 1, 16)
    last = 4 * SATURATED_KEYS
    grid = AttentionGrid([(ctx, 8, 1, last // 2, 1e-3), (ctx, 8, 1, last, 3e-3), (dec, 8, 1, last, 2e-5),
                          (short, 8, 1, SATURATED_KEYS // 2, 1e-4)])
    assert grid.seconds(ctx, 8, 1, 3 * last) == pytest.approx(3e-3 * 9, rel=1e-12)
    assert grid.seconds(ctx, 8, 1, 3 * last, extrapolate=False) is None
    assert grid.seconds(ctx, 8, 1, last) == pytest.approx(3e-3, rel=1e-12)  # a measured point stays itself
    # a decode line of one sequence streams 8 x 16k rows, below its plateau: not extended (nor as s^2)
    assert grid.seconds(dec, 8, 1, 2 * last) is None
    assert grid.seconds(short, 8, 1, SATURATED_KEYS) is None  # a line below the plateau is not extended


def test_long_context_attention_on_the_shipped_grid_is_extrapolated_and_its_backward_derived():
    design = next(iter(load_system("dgx-h100-cluster:nodes=1").designs.values()))
    model = default_cost_model()
    (f16, _), (f32, b32) = _attention_ops(16384), _attention_ops(32768)
    at16, at32 = model.op_cost(f16, design), model.op_cost(f32, design)
    assert (at16.model, at32.model) == ("measured", "extrapolated")
    assert at32.time == pytest.approx(4 * at16.time, rel=1e-12)
    back = model.op_cost(b32, design)
    assert back.model == "derived" and back.time == pytest.approx(at32.time * backward_ratio(128, 32768), rel=1e-12)
    assert model.op_times([f32, b32], [design, design]).tolist() == [at32.time, back.time]


def test_a_decode_kernel_past_a_saturated_line_grows_as_the_cache_it_streams():
    from marssim.cost.attention_grid import SATURATED_DECODE_ROWS, AttentionFamily, AttentionGrid, SliceKey, saturated

    dec = SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.DECODE, 4, 16)  # 32 heads over 8 key/value heads
    # a line of 256 sequences that stops at 1,024 keys (256 x 1024 x 8 = 2M rows: at its plateau), one of
    # 128 sequences that reaches 2,048 keys, and one of 2 sequences far below the plateau
    grid = AttentionGrid([(dec, 32, 256, 512, 1.9e-4), (dec, 32, 256, 1024, 3.7e-4),
                          (dec, 32, 128, 1024, 1.9e-4), (dec, 32, 128, 2048, 3.66e-4),
                          (dec, 32, 2, 1024, 1.3e-5)])
    assert saturated(dec.family, dec.group, 32, 256, 1024) and not saturated(dec.family, dec.group, 32, 2, 1024)
    assert 256 * 1024 * 8 >= SATURATED_DECODE_ROWS > 2 * 1024 * 8
    assert grid.seconds(dec, 32, 256, 1100) == pytest.approx(3.7e-4 * 1100 / 1024, rel=1e-12)  # linear in the keys
    assert grid.seconds(dec, 32, 256, 1100, extrapolate=False) is None
    assert grid.seconds(dec, 32, 256, 1024) == pytest.approx(3.7e-4, rel=1e-12)  # a measured point stays itself
    assert grid.seconds(dec, 32, 2, 2048) is None  # a line below its plateau is not extended
    # between two lines, where both measured its cached tokens (200 x 1,100): each at its own keys
    u = math.log(200 / 128) / math.log(2)
    tokens = 200 * 1100
    lo = 1.9e-4 * (tokens / 128 / 1024) ** math.log2(3.66e-4 / 1.9e-4)
    hi = 1.9e-4 * (tokens / 256 / 512) ** math.log2(3.7e-4 / 1.9e-4)
    assert grid.seconds(dec, 32, 200, 1100) == pytest.approx(math.exp((1 - u) * math.log(lo) + u * math.log(hi)),
                                                             rel=1e-12)
    # where the line of fewer sequences does not reach them (200 x 1,500 past 128 x 2,048): each corner
    # extended on its own line, then blended in ln(sequences)
    lo, hi = 1.9e-4 * (1500 / 1024) ** math.log2(3.66e-4 / 1.9e-4), 3.7e-4 * 1500 / 1024
    assert grid.seconds(dec, 32, 200, 1500) == pytest.approx(math.exp((1 - u) * math.log(lo) + u * math.log(hi)),
                                                             rel=1e-12)


def test_a_decode_step_past_the_shipped_grid_is_extrapolated_not_the_roofline():
    """The shipped H100 decode grid of Llama 3 8B's heads stops at 1,024 keys for 256 sequences: a
    longer cache takes that point's time times the keys, scalar and vectorised alike."""
    from marssim.cost.attention_grid import op_seconds
    from marssim.cost.features import op_features

    design = next(iter(load_system("dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20").designs.values()))
    model = default_cost_model()
    cfg = with_overrides(load_model("llama3-8b"), mode="serve", prompt=8, generate=2, batch=1, layers=1,
                         attention="flash")
    core = next(op for op in build_transformer(cfg).ops if op.name.startswith("decode.1.") and op.param("core"))
    last, past = core.with_loops(B=256, N=1024), core.with_loops(B=256, N=1536)
    at_last, at_past = model.op_cost(last, design), model.op_cost(past, design)
    assert at_last.model == "measured" and at_past.model == "extrapolated"
    assert at_past.time == pytest.approx(at_last.time * 1.5, rel=1e-12)
    assert model.op_times([past], [design]).tolist() == [at_past.time]
    assert op_seconds(model._dparams[model._did(design)].gpu.attention, op_features(past), extrapolate=False) is None


def test_a_decode_kernel_between_lines_that_stop_short_takes_the_same_cached_tokens():
    """Between a line of 256 sequences (to 2,048 keys) and one of 512 that stops at 1,024 keys, both
    below the plateau (one key/value head), a kernel of 362 sequences at 1,152 keys is timed from the
    two lines at its own cached tokens (362 x 1,152), not left to the fitted curve."""
    from marssim.cost.attention_grid import AttentionFamily, AttentionGrid, SliceKey

    dec = SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.DECODE, 16, 16)  # 16 heads over 1 key/value head
    pts = {(256, 1024): 4.7e-5, (256, 2048): 7.0e-5, (512, 512): 5.1e-5, (512, 1024): 7.1e-5}
    grid = AttentionGrid([(dec, 16, b, s, t) for (b, s), t in pts.items()])

    def on_line(b: int, lo: int, hi: int, s: float) -> float:  # ln t linear in ln s between two measured keys
        u = math.log(s / lo) / math.log(hi / lo)
        return (1 - u) * math.log(pts[b, lo]) + u * math.log(pts[b, hi])

    tokens = 362 * 1152
    w = math.log(362 / 256) / math.log(2)
    want = math.exp((1 - w) * on_line(256, 1024, 2048, tokens / 256) + w * on_line(512, 512, 1024, tokens / 512))
    assert grid.seconds(dec, 16, 362, 1152, extrapolate=False) == pytest.approx(want, rel=1e-12)
    assert grid.seconds(dec, 16, 362, 1152) == pytest.approx(want, rel=1e-12)
    # where both lines reach the keys, the usual interpolation in ln(sequences) at the same keys holds
    same = math.exp((1 - w) * math.log(pts[256, 1024]) + w * math.log(pts[512, 1024]))
    assert grid.seconds(dec, 16, 362, 1024) == pytest.approx(same, rel=1e-12)
    # no line of fewer sequences reaches 600 x 1,024 cached tokens: nothing between measured kernels
    assert grid.seconds(dec, 16, 362, 1700, extrapolate=False) is None


def test_a_decode_line_below_its_plateau_is_extended_by_its_own_last_slope_at_most_linearly():
    from marssim.cost.attention_grid import AttentionFamily, AttentionGrid, SliceKey, saturated

    dec = SliceKey("bf16", "fwd", "flash", 128, AttentionFamily.DECODE, 16, 16)
    grid = AttentionGrid([(dec, 16, 512, 512, 5.1e-5), (dec, 16, 512, 1024, 7.1e-5),
                          (dec, 16, 8, 512, 1.0e-5), (dec, 16, 8, 1024, 2.6e-5)])
    assert not saturated(dec.family, dec.group, 16, 512, 1024)
    slope = math.log(7.1 / 5.1) / math.log(2)
    assert grid.seconds(dec, 16, 512, 1536) == pytest.approx(7.1e-5 * 1.5 ** slope, rel=1e-12)
    assert grid.seconds(dec, 16, 512, 1536, extrapolate=False) is None
    # a last segment steeper than the cache it streams (2.6x for twice the keys) is extended linearly
    assert grid.seconds(dec, 16, 8, 2048) == pytest.approx(2.6e-5 * 2, rel=1e-12)


@pytest.mark.parametrize("kv", ["bf16", "fp8"])
def test_a_large_decode_batch_over_one_key_value_head_is_timed_from_the_shipped_grid_not_the_curve(kv):
    """Llama 3.1 405B at tp 8 (16 query heads over one key/value head a GPU): the shipped H100 grid's
    line of 512 sequences stops at 1,024 keys, so 432 sequences at 1,152 keys lie between the lines
    of 256 and 512 only at their cached tokens; the kernel is interpolated there, between what the
    two lines take for those tokens, and an FP8 cache streams faster than a bf16 one."""
    design = next(iter(load_system("dgx-h100-cluster:nodes=1,stack=trtllm-1.3.0rc20").designs.values()))
    model = default_cost_model()
    cfg = with_overrides(load_model("llama3-405b"), mode="serve", prompt=8, generate=2, batch=1, layers=1,
                         attention="flash", kv_dtype=kv)
    core = next(op for op in build_transformer(cfg).ops if op.name.startswith("decode.1.") and op.param("core"))
    times = {}
    for b, s in ((432, 1152), (256, 432 * 1152 // 256), (512, 432 * 1152 // 512)):
        c = model.op_cost(core.with_loops(B=b, H=16, N=s), design)
        assert c.model in ("interpolated", "measured"), (b, s, c.model)
        times[b] = c.time
    assert min(times[256], times[512]) <= times[432] <= max(times[256], times[512])
    assert model.op_times([core.with_loops(B=432, H=16, N=1152)], [design]).tolist() == [times[432]]
    if kv == "fp8":
        bf16 = with_overrides(cfg, kv_dtype="bf16")
        core16 = next(op for op in build_transformer(bf16).ops if op.name.startswith("decode.1.") and op.param("core"))
        assert times[432] < model.op_cost(core16.with_loops(B=432, H=16, N=1152), design).time
