"""attention=flash: the attention core of an LLM graph as one fused kernel per block (forward and
backward), checked against closed forms and against the unfused graph it replaces; the kernel
phase of every op of a training graph; and the cost model's lookups by phase and fused
attention backend (a gradient falls back to the forward row of its shape, a fused op never
takes a row of the unfused products or of another backend)."""

from __future__ import annotations

import pytest

from marssim.cli import main
from marssim.cost import DataflowCost
from marssim.cost.calibrated import KernelTable, KernelTiming, lookup_keys, shape_key
from marssim.cost.features import kernel_backend, kernel_phase, op_features
from marssim.errors import InputError
from marssim.mapping.sharding import legal_strategies, shard_regions
from marssim.system import Design
from marssim.workload import OpKind, load_workload
from marssim.workload.llm import footprint, transformer_of

GPT = "gpt3-1.3b:mode=train,layers=2,seq=512,batch=2"
LLAMA = "llama:layers=2,hidden=512,heads=8,kv_heads=2,ffn=1024,vocab=1000,mode=train,seq=256,batch=2"


def _ops(spec):
    g = load_workload(spec)
    return g, {op.name: op for op in g.ops}


@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_fused_core_does_the_products_it_replaces(spec):
    _, unfused = _ops(spec)
    g, fused = _ops(spec + ",attention=flash")
    t = transformer_of(g)
    b, s, h, kv, d, eb = t.batch, t.seq, t.heads, t.kv, t.d_head, 2
    for i in range(t.layers):
        p = f"layers.{i}.attn."
        core, grad = fused[p + "core"], fused[p + "core.grad"]
        assert core.flops == unfused[p + "qk"].flops + unfused[p + "pv"].flops == 4 * b * h * s * s * d
        assert grad.flops == sum(unfused[p + x].flops for x in ("qk.grad_a", "qk.grad_b", "pv.grad_a", "pv.grad_b"))
        assert grad.flops == 2 * core.flops
        assert core.bytes_moved == eb * b * s * d * (2 * h + 2 * kv)  # Q and the context, K and V
        assert grad.bytes_moved == eb * b * s * d * ((3 * h + 2 * kv) + (h + 2 * kv))  # Q K V O dO in; dQ dK dV out
        assert core.gemm_view() == (2 * b * h, s, s, d) and grad.gemm_view() == (4 * b * h, s, s, d)
        assert p + "softmax" not in fused and p + "qk" not in fused
    f_unfused = footprint(load_workload(spec))
    f_fused = footprint(g)
    core_streaming = sum(op.flops for name, op in unfused.items() if ".attn.softmax" in name
                         or ".attn.dropout" in name)  # the softmax, dropout and their gradients: inside the kernels
    assert f_unfused.total_flops - f_fused.total_flops == core_streaming



@pytest.mark.parametrize("spec", [GPT, LLAMA])
def test_fusing_saves_exactly_the_score_traffic(spec):
    """The unfused core moves everything the fused kernel moves plus the a s^2 b scores through
    memory, counted by hand at 16 bits: forward 2 (Q K^T writes) + 4 (softmax reads, writes)
    + 5 (dropout reads, writes, 1-byte mask) + 2 (P V reads) bytes per score; backward 2 (dP
    written) + 2 (P read for dV) + 5 (dropout gradient: dP, mask in, out) + 6 (softmax gradient:
    Y, dY in, out) + 2 + 2 (dS read for dQ and for dK); without dropout 5 fewer each way."""
    _, unfused = _ops(spec)
    g, fused = _ops(spec + ",attention=flash")
    t = transformer_of(g)
    scores = t.heads * t.seq * t.seq * t.batch
    drop = 5 if t.dropout else 0
    assert (t.dropout > 0) == (spec == GPT)  # one spec of each kind
    p = "layers.0.attn."
    core = [n for n in ("qk", "softmax", "dropout", "pv") if p + n in unfused]
    grads = [n for n in ("pv.grad_a", "pv.grad_b", "dropout.grad", "softmax.grad", "qk.grad_a", "qk.grad_b")
             if p + n in unfused]
    assert len(grads) == (6 if drop else 5)
    fwd = sum(unfused[p + n].bytes_moved for n in core) - fused[p + "core"].bytes_moved
    bwd = sum(unfused[p + n].bytes_moved for n in grads) - fused[p + "core.grad"].bytes_moved
    assert fwd == (8 + drop) * scores
    assert bwd == (14 + drop) * scores

def test_activations_of_a_flash_block_are_korthikantis_34sbh():
    """With the scores never stored (no softmax output, no dropout mask over them), a GPT block
    keeps 34 s b h bytes at 16 bits: Korthikanti et al. 2022's figure without the 5 a s^2 b term."""
    s, b, h, a = 512, 2, 2048, 16
    unfused = footprint(load_workload(GPT)).activation_bytes_per_layer[0]
    fused = footprint(load_workload(GPT + ",attention=flash")).activation_bytes_per_layer[0]
    assert unfused == 34 * s * b * h + 5 * a * s * s * b
    assert fused == 34 * s * b * h


def test_decode_reads_the_kv_cache_through_the_fused_kernel():
    g, ops = _ops("llama3-8b:mode=decode,context=4096,batch=8,layers=1,attention=flash")
    core = ops["layers.0.attn.core"]
    assert core.loop_dict == {"B": 8, "H": 32, "M": 1, "N": 4096, "K": 128}
    assert core.inputs[1:] == ("layers.0.attn.k_cache", "layers.0.attn.v_cache")
    assert core.bytes_moved == 2 * (2 * 8 * 32 * 128 + 2 * 8 * 8 * 128 * 4096)  # q and out; K and V of 8 kv heads
    assert not core.param("causal") and kernel_phase(core) == "fwd" and kernel_backend(core) == "flash"


def test_head_shards_keep_each_query_group_with_its_key_value_head():
    _, ops = _ops(LLAMA + ",attention=flash")
    core, grad = ops["layers.0.attn.core"], ops["layers.0.attn.core.grad"]
    part = core.with_loops(H=2)  # 2 of 8 query heads: the 1 key/value head they share
    assert part.in_shapes == ((2, 2 * 64, 256, 1), (2, 64, 256, 1), (2, 64, 256, 1))
    assert part.out_shape == (2, 128, 256, 1)
    assert grad.with_loops(H=4).out_shape == (2, (4 + 2) * 64, 256, 1)
    with pytest.raises(ValueError, match="as many queries as keys"):
        grad.with_loops(M=128)
    assert legal_strategies(core) == ("none", "dp", "seq", "head")
    assert legal_strategies(grad) == ("none", "dp", "head")  # every query of a head needs every key
    out, ins, partial = shard_regions(core, "H", 4, 8)
    assert out[1] == (4 * 64, 8 * 64) and ins[1][1] == (64, 2 * 64) and not partial  # kv head 1 of 2
    out, ins, partial = shard_regions(grad, "H", 4, 8)  # per kv head: 4 query heads' dQ, then dK, dV
    assert out[1] == (1 * 6 * 64, 2 * 6 * 64) and not partial
    assert shard_regions(grad, "H", 2, 6)[2]  # half groups: partial key and value gradients


def test_attention_option_is_checked():
    with pytest.raises(InputError) as err:
        load_workload("llama3-8b:attention=fast")
    assert err.value.path == "attention" and "unfused, flash, efficient, cudnn" in str(err.value)


def test_flash_graph_runs_under_a_per_op_mapping(capsys):
    spec = "gpt3-125m:mode=train,layers=2,seq=256,attention=flash"
    assert main(["estimate", "--system", "dgx-h100", "--workload", spec, "--strategy", "head,dp",
                 "--allow-uncalibrated", "--no-report"]) == 0


# ----------------------------------------------------------------------------- kernel phases
def test_kernel_phase_of_every_op_of_a_training_step():
    g = load_workload(LLAMA + ",recompute=selective")
    phases = {op.name: kernel_phase(op) for op in g.ops if op.kind != OpKind.INPUT}
    for name, phase in phases.items():
        op = g.ops[g.index[name]]
        if name.endswith(".dgrad"):
            assert phase == "dgrad"
        elif name.endswith(".wgrad"):
            assert phase == "wgrad"
        elif name.endswith(".adam"):
            assert phase == "update"
        elif op.kind == OpKind.MATMUL and op.param("phase") == "bwd":  # dK, dV read the scores transposed
            assert phase == ("wgrad" if name.endswith(".grad_b") else "dgrad")
        elif op.param("phase") == "bwd":
            assert phase == "bwd"
        else:  # forward, recomputed and optimizer-buffer ops
            assert phase == "fwd", name
    assert sum(n.endswith(".recompute") for n in phases) > 0
    assert {phases[n] for n in phases if n.endswith(".recompute")} == {"fwd"}
    assert kernel_phase(load_workload("resnet50").ops[1]) == "fwd"


# ----------------------------------------------------------------------------- lookups
def _design() -> Design:
    return Design(name="h100", dataflow="gpu", clock=1.83e9, sram=50 * 2**20, sram_bandwidth=9.4e12,
                  dram_bandwidth=3.35e12, gpu={"sms": 132, "peak_flops": {"bf16": 989.4e12, "fp32": 66.9e12},
                                               "calibration": "T"})


def _row(kind, batch, m, n, k, median, phase="fwd", backend="", flops=0.0, nbytes=1.0):
    flops = flops or 2.0 * batch * m * n * k
    return KernelTiming(kind, "bf16", batch, m, n, k, flops, nbytes, "T", 132, "1", "12", "vendor", median, 0.0, 20,
                        "2026-01-01", phase=phase, backend=backend)


def test_gradients_take_their_own_phase_else_the_forward_row_of_their_shape():
    _, ops = _ops(LLAMA)
    fwd, dgrad = ops["layers.0.attn.proj"], ops["layers.0.attn.proj.dgrad"]
    assert fwd.gemm_view() == dgrad.gemm_view()  # proj: tokens x hidden by hidden; its dgrad: the same GEMM
    view = fwd.gemm_view()
    only_fwd = DataflowCost(calibration=KernelTable((_row("gemm", *view, 1e-3),)))
    assert only_fwd.op_cost(dgrad, _design()).time == 1e-3  # a table without gradient rows: as before
    both = DataflowCost(calibration=KernelTable((_row("gemm", *view, 1e-3), _row("gemm", *view, 2e-3, "dgrad"))))
    assert both.op_cost(dgrad, _design()).time == 2e-3 and both.op_cost(fwd, _design()).time == 1e-3
    wgrad = ops["layers.0.attn.proj.wgrad"]
    wrong = DataflowCost(calibration=KernelTable((_row("gemm", *view, 2e-3, "dgrad"),)))
    assert wrong.op_cost(wgrad, _design()).model != "measured"  # another phase is never taken
    key = shape_key("gemm", "bf16", *view, 0, 0, None, "wgrad")
    assert lookup_keys(key) == (key, (*key[:9], "fwd", ""))


def test_fused_attention_takes_only_rows_of_its_backend():
    _, ops = _ops(LLAMA + ",attention=flash")
    core = ops["layers.0.attn.core"]
    x = op_features(core)
    view = core.gemm_view()
    traffic = float(core.bytes_moved)

    def time_with(*rows):
        return DataflowCost(calibration=KernelTable(rows)).op_cost(core, _design())

    assert time_with(_row("attention", *view, 1e-3)).model != "measured"  # the unfused products' row of this view
    assert time_with(_row("attention", *view, 1e-3, backend="efficient")).model != "measured"
    got = time_with(_row("attention", *view, 1e-3, backend="efficient"), _row("attention", *view, 3e-3,
                                                                               backend="flash", nbytes=traffic))
    assert got.model == "measured" and got.time == 3e-3
    assert x[-1] == 1  # the flash backend's code
    table = KernelTable((_row("attention", *view, 3e-3, backend="flash"), _row("attention", 1, 64, 64, 64, 1e-5,
                                                                                   phase="dgrad")))
    assert table.groups() == {}  # fused attention and gradient rows are not fitted
