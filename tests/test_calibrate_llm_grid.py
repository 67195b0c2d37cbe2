"""The LLM calibration grid (marssim/calibrate/llm.py), without torch: its points are exactly the
kernels the parallel lowering asks the cost model for (checked end to end: a table with one row
per point, each with its own median, and every shard the lowering times comes out "measured"
at its own point's median), shapes worked out by hand for GPT-3 175B and Llama 3 70B, and the
CLI's dry run."""

from __future__ import annotations

import pytest

from marssim.calibrate.grid import SDPA
from marssim.calibrate.llm import LLM_KINDS, LlmGridOptions, llm_grid, llm_runs, tp_shards
from marssim.cli import main
from marssim.cost import DataflowCost
from marssim.cost.calibrated import KernelTable, KernelTiming, shape_key
from marssim.calibrate.coverage import op_shape_key
from marssim.parallel import ParallelConfig
from marssim.parallel.lower import lower_parallel
from marssim.system import load_system
from marssim.workload import OpKind, load_workload

GPT = "gpt3-125m:hidden=256,heads=4,vocab=1001"
LLAMA = "llama:hidden=256,heads=8,kv_heads=2,ffn=512,vocab=1001"
SMALL = LlmGridOptions(models=(GPT, LLAMA), tp=(2, 4), micro_batches=(1, 2), seq=128, decode_contexts=(64,),
                       decode_batches=(2,), backends=("flash", "efficient"))


@pytest.fixture(scope="module")
def small_grid():
    return llm_grid(SMALL)


@pytest.fixture(scope="module")
def fp8_grid():
    return llm_grid(LlmGridOptions(**{**SMALL.__dict__, "dtype": "fp8"}))


def _table(points) -> tuple[KernelTable, dict]:
    """One row per point, each with its own median; the medians by lookup key."""
    rows, median = [], {}
    for i, p in enumerate(points):
        t = 1e-4 * (1.0 + i / 8192)
        rows.append(KernelTiming(p.kind, p.dtype, p.batch, p.m, p.n, p.k, float(p.flops), float(p.bytes), "H100", 132,
                                 "550.54.15", "12.4", "vendor", t, 0.0, 20, "2026-01-01", phase=p.phase,
                                 backend=p.backend))
        assert p.key not in median
        median[p.key] = t
    return KernelTable(tuple(rows)), median


class Recording(DataflowCost):
    """The default cost model, remembering every (op, cost) the lowering asks for."""

    def __init__(self, table: KernelTable) -> None:
        super().__init__(calibration=table)
        self.seen = []

    def op_cost(self, op, design):
        cost = super().op_cost(op, design)
        self.seen.append((op, cost))
        return cost


CASES = [  # (workload, parallel configuration on the 8 GPUs of one DGX H100)
    (f"{GPT},mode=train,seq=128,batch=1", ParallelConfig(tp=2, dp=4, sp=True, micro_batch=1)),
    (f"{GPT},mode=train,seq=128,batch=2,attention=flash", ParallelConfig(tp=4, dp=2, micro_batch=2)),
    (f"{LLAMA},mode=train,seq=128,batch=2", ParallelConfig(tp=2, dp=4, micro_batch=2, zero=0)),
    (f"{LLAMA},mode=train,seq=128,batch=1,attention=flash", ParallelConfig(tp=4, dp=2, sp=True, micro_batch=1)),
    (f"{LLAMA},mode=decode,context=64,batch=2", ParallelConfig(tp=4, dp=2, micro_batch=2)),
    (f"{LLAMA},mode=decode,context=64,batch=2,attention=flash", ParallelConfig(tp=2, dp=4, micro_batch=2)),
    (f"{GPT},mode=prefill,seq=128,batch=1", ParallelConfig(tp=4, dp=2, micro_batch=1)),
    # FP8: casts read one type and write another (bf16 in, fp8 out); GEMMs compute in fp8 and write bf16
    (f"{LLAMA},mode=train,seq=128,batch=1,dtype=fp8", ParallelConfig(tp=2, dp=4, sp=True, micro_batch=1)),
    (f"{GPT},mode=prefill,seq=128,batch=1,dtype=fp8", ParallelConfig(tp=4, dp=2, micro_batch=1)),
]


@pytest.mark.parametrize("spec,parallel", CASES)
def test_every_shard_the_lowering_times_is_a_grid_point(small_grid, fp8_grid, spec, parallel):
    table, median = _table(fp8_grid if "dtype=fp8" in spec else small_grid)
    cost = Recording(table)
    system = load_system("dgx-h100-cluster:nodes=1")
    graph = load_workload(spec + ",layers=2")
    lower_parallel(graph, system, parallel, cost)
    # the graph's ops (the kernels Megatron-LM adds around them in training -- bias adds, fused
    # bias-dropout-add, the optimizer's bookkeeping -- are not grid points: docs/parallelism.md)
    timed = [(op, c) for op, c in cost.seen if op.kind != OpKind.RESHAPE and op.name in graph.index]
    # the lowering times each distinct shape once; every family of a block was among them
    suffixes = {op.name.split(".", 2)[-1] if op.name.startswith("layers.") else op.name for op, _ in timed}
    assert {"attn.qkv", "attn.proj", "input_norm", "mlp.act", "embed.tokens", "output"} <= suffixes
    kinds = set()
    for op, c in timed:
        key = op_shape_key(op)
        assert key in median, (op.name, key)
        assert c.model == "measured" and c.time == median[key], (op.name, c.model)
        kinds.add((key[0], key[9], key[10]))
    if "train" in spec:  # the gradients and the optimizer step were asked for, and found
        assert {("gemm", "dgrad", ""), ("gemm", "wgrad", ""), ("elementwise", "update", "")} <= kinds
    if "attention=flash" in spec:
        assert ("attention", "fwd", "flash") in kinds and ("attention", "fwd", "") not in kinds
        if "train" in spec:
            assert ("attention", "bwd", "flash") in kinds


def test_tp_shards_agree_with_the_shapes_a_rank_holds():
    """Column-parallel GEMMs split N, row-parallel ones K, attention the heads; the weight
    gradients keep the forward's split; the AdamW step runs over a rank's parameters."""
    graph = load_workload(f"{LLAMA},mode=train,seq=128,batch=1,layers=1")
    shards = {op.name: s for op, s in tp_shards(graph, ParallelConfig(tp=4))}
    qkv_out = (8 + 2 * 2) * 32  # (heads + 2 kv heads) x head dim
    assert shards["layers.0.attn.qkv"].gemm_view() == (1, 128, qkv_out // 4, 256)
    assert shards["layers.0.attn.qkv.wgrad"].gemm_view() == (1, 256, qkv_out // 4, 128)
    assert shards["layers.0.attn.qkv.dgrad"].gemm_view() == (1, 128, 256, qkv_out // 4)
    assert shards["layers.0.attn.proj"].gemm_view() == (1, 128, 256, 256 // 4)
    assert shards["layers.0.mlp.down.wgrad"].gemm_view() == (1, 512 // 4, 256, 128)
    assert shards["layers.0.attn.qk"].gemm_view() == (8 // 4, 128, 128, 32)
    assert shards["output"].gemm_view() == (1, 128, -(-1001 // 4), 256)  # the vocabulary padded to 4 equal parts
    block = (256 * qkv_out + 256 * 256 + 3 * 256 * 512) // 4 + 2 * 256  # the two RMSNorm scales whole on every rank
    assert shards["layers.0.adam"].dim("C") == block
    assert "layers.0.attn.q" not in shards  # views are not timed


def test_grid_is_deduplicated_deterministic_and_independent_of_the_block_count(small_grid):
    keys = [(p.measure_kind, p.key) for p in small_grid]
    assert len(keys) == len(set(keys))
    assert llm_grid(SMALL) == small_grid
    deeper = llm_grid(LlmGridOptions(**{**SMALL.__dict__, "layers": 3}))
    assert {(p.measure_kind, p.key) for p in deeper} == set(keys)
    assert [p.measure_kind for p in small_grid] == sorted((p.measure_kind for p in small_grid), key=LLM_KINDS.index)


def test_fused_attention_points_come_once_per_backend(small_grid):
    sdpa = [p for p in small_grid if p.measure_kind == SDPA]
    assert {p.backend for p in sdpa} == {"flash", "efficient"} and all(p.kind == "attention" for p in sdpa)
    by_shape: dict = {}
    for p in sdpa:
        by_shape.setdefault((p.batch, p.m, p.n, p.k, p.phase), set()).add(p.backend)
    assert all(b == {"flash", "efficient"} for b in by_shape.values())
    unfused = {(p.batch, p.m, p.n, p.k) for p in small_grid if p.measure_kind == "attention"}
    assert all(not p.backend for p in small_grid if p.measure_kind != SDPA)
    decode = [p for p in sdpa if p.m == 1]  # one query over the KV cache: 2 products x batch 2 x heads / tp
    assert {(p.batch, p.n, p.k) for p in decode} == {(2 * 2 * 8 // tp, 64, 32) for tp in (2, 4)} | \
        {(2 * 2 * 4 // tp, 64, 64) for tp in (2, 4)}  # Llama: 8 heads of 32; GPT: 4 heads of 64
    assert unfused  # the unfused products are points of their own kind


def test_gpt3_175b_and_llama3_70b_shapes_by_hand():
    options = LlmGridOptions(models=("gpt3-175b", "llama3-70b"), tp=(8,), micro_batches=(1,), prefill=False,
                             decode_contexts=(4096,), decode_batches=(64,), backends=("flash",))
    keys = {p.key for p in llm_grid(options)}
    h, tokens = 12288, 2048
    for key in [("gemm", 1, tokens, 3 * h // 8, h, "fwd"),            # QKV, column-parallel
                ("gemm", 1, tokens, h, 3 * h // 8, "dgrad"),
                ("gemm", 1, h, 3 * h // 8, tokens, "wgrad"),          # K x N by the tokens
                ("gemm", 1, tokens, h, h // 8, "fwd"),                # attention output, row-parallel
                ("gemm", 1, tokens, 4 * h // 8, h, "fwd"),            # fc1
                ("gemm", 1, tokens, -(-50257 // 8), h, "fwd"),        # the output layer over the padded vocabulary
                ("attention", 96 // 8, tokens, tokens, 128, "fwd"),   # Q K^T of 12 heads per rank
                ("attention", 2 * 96 // 8, tokens, tokens, 128, "fwd", "flash"),
                ("attention", 4 * 96 // 8, tokens, tokens, 128, "bwd", "flash"),
                # Llama 3 70B at seq 4096: QKV of (64 + 2 x 8) heads of 128, SwiGLU of 28,672 (its gate and
                # up projections one GEMM of twice the width), GQA decode
                ("gemm", 1, 4096, 80 * 128 // 8, 8192, "fwd"),
                ("gemm", 1, 4096, 2 * 28672 // 8, 8192, "fwd"),
                ("gemm", 1, 4096, 8192, 2 * 28672 // 8, "dgrad"),
                ("gemm", 1, 28672 // 8, 8192, 4096, "wgrad"),         # down's weight gradient
                ("gemm", 1, 64, 80 * 128 // 8, 8192, "fwd"),          # decode: one token of 64 sequences
                ("attention", 64 * 64 // 8, 1, 4096, 128, "fwd"),     # q of one token over 4,096 cached keys
                ("attention", 2 * 64 * 64 // 8, 1, 4096, 128, "fwd", "flash")]:
        kind, batch, m, n, k, phase, *backend = key
        assert shape_key(kind, "bf16", batch, m, n, k, 0, 0, None, phase, *backend) in keys, key


def test_runs_skip_configurations_the_model_cannot_split():
    runs = llm_runs(LlmGridOptions(models=("gpt3-125m:heads=12",), tp=(1, 8), micro_batches=(1,), prefill=False,
                                   decode_contexts=(), attention=("unfused",)))
    assert {r.parallel.tp for r in runs} == {1}  # 12 heads do not split 8 ways
    decode = llm_runs(LlmGridOptions(models=("gpt3-125m",), tp=(1,), train=False, prefill=False,
                                     decode_contexts=(1024, 4096), decode_batches=(1,), attention=("unfused",)))
    assert [r.spec.split("context=")[1].split(",")[0] for r in decode] == ["1024"]  # the 2,048-position table


def test_dry_run_prints_the_llm_grid_per_kind_and_phase(capsys):
    args = ["calibrate", "measure", "--llm", "--llm-models", GPT, "--llm-tp", "2", "--llm-micro-batches", "1",
            "--llm-seq", "128", "--no-triton", "--dry-run"]
    assert main(args) == 0
    text = capsys.readouterr().out
    assert "dry run" in text and "LLM workloads" in text
    rows = {tuple(line.split()[:2]) for line in text.splitlines() if line.startswith("  ")}
    for kind, phase in [("gemm", "fwd"), ("gemm", "dgrad"), ("gemm", "wgrad"), ("attention", "wgrad"),
                        ("sdpa", "bwd"), ("elementwise", "update"), ("norm", "bwd"), ("embedding", "fwd")]:
        assert (kind, phase) in rows, (kind, phase)
    total = next(line for line in text.splitlines() if "total:" in line)
    assert "kernels, about" in total


@pytest.mark.parametrize("flags,message", [
    (["--llm", "--workloads", "resnet50"], "--workloads: the LLM grid"),
    (["--llm", "--shards", "2"], "--shards: the LLM grid"),
    (["--llm-tp", "2"], "--llm-tp: applies to the LLM grid"),
    (["--llm", "--llm-tp", "0"], "--llm-tp: expected comma-separated integers"),
    (["--llm", "--kinds", "conv"], "--kinds: expected some of"),
    (["--llm", "--llm-attention-backends", "fast"], "--llm-attention-backends: expected some of"),
    (["--llm", "--llm-models", "resnet50"], "expected an LLM workload"),
])
def test_llm_flags_are_checked(flags, message, capsys):
    assert main(["calibrate", "grid", *flags]) == 2
    assert message in capsys.readouterr().err
