"""The parallelism and overlap settings of a parallel configuration (context parallelism,
tensor-parallel communication overlap, the parameter all-gather's and the pipeline's overlap, FP8
parameter gathers): their checks, the context-parallel ring against the unsplit attention's FLOPs
and the ring's closed-form volume and time, each overlap against its closed form where nothing
contends and never slower than no overlap there, the memory each adds by term, and the search's
level-2 genes."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from marssim.cli import main
from marssim.cost import default_cost_model
from marssim.cost.base import OpCost
from marssim.errors import InputError
from marssim.parallel import check_parallel, lower_parallel, memory_estimate, parse_parallel, prepare_graph
from marssim.parallel import userbuffers
from marssim.parallel.analytic import screen
from marssim.parallel.context import backward_ring_end, forward_ring_end, kv_buffer_bytes
from marssim.parallel.report import report_of
from marssim.sim import simulate
from marssim.system import load_system
from marssim.taskgraph import COMPUTE
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of

COST = default_cost_model()
NODE = "dgx-h100-cluster:nodes=1"
LLAMA = "llama:layers={layers},hidden=1024,heads=16,kv_heads=8,ffn=2048,vocab=1000,seq={seq},mode=train"


def _workload(layers: int = 1, seq: int = 1024, extra: str = ",attention=flash") -> str:
    return LLAMA.format(layers=layers, seq=seq) + extra


@dataclass(frozen=True)
class LinearCost:
    """A cost model whose time is proportional to an op's FLOPs and bytes (no efficiency curve,
    no launch overhead): a GEMM split in chunks takes exactly as long as the whole."""

    flops_per_s: float = 400e12
    bytes_per_s: float = 3e12

    def op_cost(self, op, design) -> OpCost:
        seconds = op.flops / self.flops_per_s + (op.input_bytes + op.output_bytes + op.weight_bytes) / self.bytes_per_s
        return OpCost(seconds, 0.0, seconds, 0.0, 0.0, 0.0, "linear")

    def op_time(self, op, design) -> float:
        return self.op_cost(op, design).time


def _link(system, a: str = "gpu0", b: str = "gpu1") -> tuple[float, float]:
    """Latency (s) and bandwidth (B/s) of the route between two GPUs of a node."""
    return system.route(a, b).latency, system.bottleneck_bandwidth(a, b)


# ---------------------------------------------------------------- checks


@pytest.mark.parametrize("spec,config,key", [
    (_workload(seq=1020), "cp=4,dp=2", "cp"),  # 1020 is not a multiple of 2 x cp = 8
    (_workload(extra=""), "cp=2,dp=4", "cp"),  # context parallelism needs the fused attention core
    (_workload().replace("mode=train", "mode=prefill"), "cp=2,dp=4", "cp"),
    (_workload(), "tp=2,dp=4,tp_comm_overlap=true", "tp_comm_overlap"),  # needs sequence parallelism
    (_workload(), "tp=2,dp=4,sp=true,overlap_param_gather=true", "overlap_param_gather"),  # needs zero 1 or 2
    (_workload(), "tp=2,dp=4,sp=true,zero=1,overlap_grad_reduce=false,overlap_param_gather=true",
     "overlap_param_gather"),
    (_workload(layers=4), "tp=2,pp=2,dp=2,overlap_p2p_comm=true", "overlap_p2p_comm"),  # 1F1B: Megatron turns it off
    (_workload(), "tp=8,overlap_p2p_comm=true", "overlap_p2p_comm"),  # one stage: nothing to overlap
    (_workload(), "tp=2,dp=2,cp=3", "tp"),  # 2 x 2 x 3 is not the node's 8 GPUs
    (_workload(), "tp=2,dp=4,etp=2", "etp"),  # expert tensor parallelism of a dense model
    ("moe:layers=1,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=64,experts=4,top_k=2,mode=train",
     "tp=4,dp=2,ep=2,sp=true,etp=3", "etp"),  # not a divisor of tp
])
def test_illegal_combinations_name_the_key(spec, config, key) -> None:
    graph = load_workload(spec)
    with pytest.raises(InputError) as info:
        check_parallel(parse_parallel(config), transformer_of(graph), 8)
    assert info.value.problems[0][0] == key


def test_cli_refuses_an_illegal_setting_in_one_line(capsys) -> None:
    code = main(["simulate", "--system", NODE, "--workload", _workload(seq=1020), "--parallel", "dp=2,cp=4"])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "cp" in err[0]


def test_settings_round_trip_through_the_spec_parser() -> None:
    cfg = parse_parallel("tp=2,dp=2,cp=2,sp=true,zero=1,tp_comm_overlap=true,overlap_param_gather=true")
    assert (cfg.cp, cfg.tp_comm_overlap, cfg.overlap_param_gather, cfg.overlap_p2p_comm) == (2, True, True, False)
    assert cfg.gpus == 8 and cfg.dp_cp == 4
    assert parse_parallel(cfg.text()) == cfg
    with pytest.raises(InputError):
        parse_parallel("cp=0")


# ---------------------------------------------------------------- context parallelism


def test_context_parallel_attention_is_the_unsplit_attention_in_flops_and_balanced() -> None:
    """Every GPU of a tp=2, cp=4 group runs cp steps of the attention core; their FLOPs add up to
    the unsplit core's (the whole sequence, heads split over tp), equally on every GPU (the
    load-balanced chunks)."""
    system = load_system(NODE)
    spec = _workload(seq=2048)
    tg = lower_parallel(load_workload(spec), system, parse_parallel("tp=2,cp=4"), COST, folding=False)
    unsplit = load_workload(spec)
    for name in ("layers.0.attn.core", "layers.0.attn.core.grad"):
        op = unsplit.ops[unsplit.index[name]]
        i = tg.op_names.index(name)
        mask = (tg.op == i) & (tg.kind == COMPUTE)
        per_gpu = np.bincount(tg.device[mask], weights=tg.flops[mask], minlength=8)
        assert per_gpu.sum() == pytest.approx(op.flops, rel=1e-12)
        assert np.allclose(per_gpu, op.flops / 8, rtol=1e-12)
        assert mask.sum() == 8 * 4  # cp steps on each of the 8 GPUs


def test_context_parallel_volume_is_the_rings_closed_form() -> None:
    """Bytes each GPU sends to its context-parallel neighbour in one iteration: per layer and
    micro-batch, (cp - 1) key/value blocks forward and 2 (cp - 1) backward (blocks and their
    gradients); a block is the keys and values of seq/cp tokens of the rank's kv heads."""
    system = load_system(NODE)
    layers, seq, cp, tp, m = 2, 2048, 4, 2, 2
    graph = load_workload(_workload(layers=layers, seq=seq))
    cfg = parse_parallel(f"tp={tp},cp={cp},global_batch={m}")
    tg = lower_parallel(graph, system, cfg, COST)
    rep = report_of(tg, system, simulate(tg, system), memory=memory_estimate(prepare_graph(graph, cfg), cfg, 80e9),
                    chunks=[[-1, 0, 1, 2]])
    kv_block = 2 * (seq // cp) * (8 // tp) * 64 * 2  # K and V, bf16
    assert rep.stages[0].volume["cp"] == pytest.approx(layers * m * 3 * (cp - 1) * kv_block, rel=1e-12)


@pytest.mark.parametrize("seq", [8192, 256])  # compute-bound steps; transfer-bound steps
def test_context_parallel_ring_takes_its_closed_form_time(seq) -> None:
    """tp=1, cp=4 on one NVSwitch node (each ring hop its own links: nothing contends), kernels
    timed in proportion to their FLOPs and bytes (no launch overhead hides the regimes). Forward:
    steps of g seconds, block transfers of c: max(cp g, (cp - 1) c + g). Backward, from Transformer
    Engine's order (a block, then blocks with their gradients, then the gradients alone): with
    compute-bound steps cp g (+ nothing), with transfer-bound steps c + (cp - 2) c2 + max(c, g),
    c2 the time of a block with its gradients."""
    system = load_system(NODE)
    cp = 4
    spec = LLAMA.format(layers=1, seq=seq).replace("heads=16", "heads=32") + ",attention=flash"
    tg = lower_parallel(load_workload(spec), system, parse_parallel("dp=2,cp=4"), LinearCost(), folding=False)
    iv = simulate(tg, system).intervals
    latency, bandwidth = _link(system)
    kv = 2 * (seq // cp) * 8 * 32 * 2  # K and V of the rank's tokens (head dim 1024/32), bf16
    c, c2 = latency + kv / bandwidth, latency + 2 * kv / bandwidth
    for name, backward in (("layers.0.attn.core", False), ("layers.0.attn.core.grad", True)):
        steps = iv[(iv["op"] == name) & (iv["resource"] == "gpu0") & (iv["kind"] == "compute")]
        arriving = iv[(iv["op"] == name) & (iv["dst"] == "gpu0") & (iv["kind"] == "transfer")]
        assert len(steps) == cp and len(arriving) == (cp if backward else cp - 1)
        g = float(steps["end"].iloc[0] - steps["start"].iloc[0])
        start = float(steps["start"].min())
        end = max(float(steps["end"].max()), float(arriving["end"].max()))
        if not backward:
            want = max(cp * g, (cp - 1) * c + g)
            assert end - start == pytest.approx(want, rel=1e-9)
            assert forward_ring_end(g, c, cp) == pytest.approx(want, rel=1e-12)
            continue
        if g >= c2:
            want = cp * g
        else:
            assert g <= c
            want = c + (cp - 2) * c2 + max(c, g)
        assert end - start == pytest.approx(want, rel=1e-9)
        assert backward_ring_end(g, c, c2, cp) == pytest.approx(want, rel=1e-12)
    assert (seq == 8192) == (g >= c2)  # the two cases cover both regimes


def test_context_parallel_memory_by_term() -> None:
    """Activations of a fused-attention block are linear in the tokens: cp=2 halves them; the
    distributed optimizer's state is sharded over dp x cp; the ring's buffers are
    max((cp - 1) kv + cp out, 4 kv) for one layer's keys and values kv and context out."""
    graph = load_workload(_workload(layers=2, seq=4096))
    base = parse_parallel("tp=2,dp=4,zero=1")
    cp2 = parse_parallel("tp=2,dp=2,cp=2,zero=1")
    a = memory_estimate(prepare_graph(graph, base), base, 80e9).terms(0)
    b = memory_estimate(prepare_graph(graph, cp2), cp2, 80e9).terms(0)
    assert b["activations"] == pytest.approx(a["activations"] / 2, rel=1e-12)
    assert b["optimizer state"] == pytest.approx(a["optimizer state"], rel=1e-12)  # dp x cp = 4 both
    assert b["weights"] == pytest.approx(a["weights"], rel=1e-12)
    kv = 2 * 2048 * (8 // 2) * 64 * 2
    out = 2048 * (16 // 2) * 64 * 2
    assert a["communication buffers"] == 0
    assert b["communication buffers"] == pytest.approx(kv_buffer_bytes(2, kv, out), rel=1e-12)
    assert kv_buffer_bytes(2, kv, out) == max(kv + 2 * out, 4 * kv)


def test_context_parallel_gradients_reduce_over_dp_times_cp() -> None:
    """dp=1, cp=2: the gradients still all-reduce over the two context-parallel ranks."""
    system = load_system(NODE)
    graph = load_workload(_workload(layers=2))
    cfg = parse_parallel("tp=4,cp=2")
    tg = lower_parallel(graph, system, cfg, COST)
    groups = {c.group: len(c.devices) for c in tg.collectives if c.kind == "all_reduce" and c.group == "dp"}
    assert groups == {"dp": 2}


# ---------------------------------------------------------------- tensor-parallel overlap


def _tp_run(config: str, cost=COST, layers: int = 1, seq: int = 4096, folding: bool = False):
    system = load_system(NODE)
    graph = load_workload(LLAMA.format(layers=layers, seq=seq).replace("hidden=1024", "hidden=4096")
                          .replace("ffn=2048", "ffn=8192").replace("heads=16", "heads=32"))
    tg = lower_parallel(graph, system, parse_parallel(config), cost, folding=folding)
    return system, graph, tg, simulate(tg, system)


def test_ring_exchange_and_pipelined_reduce_scatter_take_their_closed_forms() -> None:
    """tp=8 on one node: mlp.fc1 (gate and up) in 8 chunks with the all-gather's 7 steps, each of c seconds
    (latency + tokens/8 x hidden x 2 B over NVLink): max(8 g, 7 c + g); mlp.down in 4 chunks, each
    timed as its shape on all but 16 of the 132 SMs, each chunk's reduce-scatter (7 steps of a
    quarter of the output / 8) after the chunk and the one before: max_k((k + 1) g + (4 - k) r)."""
    # rings at the links' line rate and no host launch gaps: the closed form's terms
    system, graph, tg, result = _tp_run("tp=8,sp=true,tp_comm_overlap=true,collectives=line,host_gaps=false")
    iv = result.intervals
    latency, bandwidth = _link(system)
    tokens, hidden = 4096, 4096
    gate = iv[(iv["op"] == "layers.0.mlp.fc1") & (iv["resource"] == "gpu0")]
    assert len(gate) == 8
    g = float(gate["end"].iloc[0] - gate["start"].iloc[0])
    c = latency + tokens // 8 * hidden * 2 / bandwidth
    assert float(gate["end"].max() - gate["start"].min()) == pytest.approx(max(8 * g, 7 * c + g), rel=1e-9)
    down = iv[(iv["op"] == "layers.0.mlp.down") & (iv["resource"] == "gpu0") & (iv["kind"] == "compute")]
    scatters = iv[(iv["op"] == "layers.0.mlp.down") & (iv["src"] == "gpu0") & (iv["kind"] == "transfer")]
    assert len(down) == 4
    g = float(down["end"].iloc[0] - down["start"].iloc[0])
    op = graph.ops[graph.index["layers.0.mlp.down"]]
    chunk = op.with_loops(M=tokens // 4, K=op.dim("K") // 8)
    design = system.design("gpu0", system.accelerator("gpu0").designs[0])
    sms = design.gpu.sms
    assert g == pytest.approx(COST.op_time(chunk, design) * sms / (sms - 16), rel=1e-9)
    r = 7 * (latency + tokens * hidden * 2 / 4 / 8 / bandwidth)
    want = max((k + 1) * g + (4 - k) * r for k in range(4))
    assert float(scatters["end"].max() - down["start"].min()) == pytest.approx(want, rel=1e-9)
    assert userbuffers.pipeline_end(g, r, 4) == pytest.approx(want, rel=1e-12)


def test_userbuffers_memory_is_ten_buffers_of_a_micro_batch() -> None:
    """Six all-gather buffers (FP8 under the FP8 recipe) and four reduce-scatter buffers (bf16),
    each seq/cp x micro-batch tokens by hidden."""
    for dtype, gather in (("bf16", 2), ("fp8", 1)):
        graph = load_workload(_workload(seq=4096, extra=f",attention=flash,dtype={dtype},batch=2"))
        for config, tokens in (("tp=4,sp=true,micro_batch=2", 8192), ("tp=4,cp=2,sp=true,micro_batch=2", 4096)):
            off = parse_parallel(config)
            on = parse_parallel(config + ",tp_comm_overlap=true")
            a = memory_estimate(prepare_graph(graph, off), off, 80e9).terms(0)["communication buffers"]
            b = memory_estimate(prepare_graph(graph, on), on, 80e9).terms(0)["communication buffers"]
            assert b - a == pytest.approx(tokens * 1024 * (6 * gather + 4 * 2), rel=1e-12)


# ---------------------------------------------------------------- overlap never slower


@pytest.mark.parametrize("off,on", [
    ("tp=8,sp=true", "tp=8,sp=true,tp_comm_overlap=true"),
    ("dp=8,zero=1", "dp=8,zero=1,overlap_param_gather=true"),
    ("tp=2,pp=2,dp=2,schedule=interleaved,virtual_stages=2,global_batch=8",
     "tp=2,pp=2,dp=2,schedule=interleaved,virtual_stages=2,global_batch=8,overlap_p2p_comm=true"),
])
def test_overlap_is_never_slower_where_nothing_contends(off, on, monkeypatch) -> None:
    """One node, a cost model linear in FLOPs and bytes (a GEMM in chunks takes what the whole
    takes) and reduction kernels that take no SMs: each overlap setting gives an iteration no
    longer than without it, and shorter (there is communication to hide)."""
    monkeypatch.setattr(userbuffers, "PIPELINE_SMS", 0)
    cost = LinearCost()
    a = _tp_run(off, cost, layers=4, folding=True)[3].makespan
    b = _tp_run(on, cost, layers=4, folding=True)[3].makespan
    assert b < a


# ---------------------------------------------------------------- parameter gathers, FP8


def test_overlapped_parameter_gather_moves_the_same_bytes_before_the_forward() -> None:
    """overlap_param_gather: the all-gathers leave the optimizer step and open the iteration (their
    bytes unchanged); each layer's first forward kernel of the first micro-batch starts after its
    bucket's gather."""
    system = load_system(NODE)
    graph = load_workload(_workload(layers=4))
    runs = {}
    for flag in (False, True):
        cfg = parse_parallel(f"tp=2,dp=4,sp=true,zero=1,bucket=1000000,overlap_param_gather={str(flag).lower()}")
        tg = lower_parallel(graph, system, cfg, COST)
        runs[flag] = (tg, simulate(tg, system))
    gathers = {flag: sum(c.nbytes for c in tg.collectives if c.kind == "all_gather" and c.group == "dp")
               for flag, (tg, _) in runs.items()}
    assert gathers[True] == pytest.approx(gathers[False], rel=1e-12)
    iv = runs[True][1].intervals
    dp_gathers = iv[(iv["kind"] == "transfer") & iv["op"].str.endswith(".adam")]  # named after a bucket's step
    optimizer = iv[(iv["kind"] == "compute") & iv["op"].str.endswith(".adam")]["start"].min()
    assert len(dp_gathers) and dp_gathers["end"].max() <= optimizer  # nothing is gathered after the step
    assert dp_gathers["start"].min() == 0.0
    first = iv[(iv["op"] == "embed.tokens") & (iv["kind"] == "compute")]["start"].min()
    assert first >= dp_gathers["end"].min()  # the first bucket (the first layers) before the first kernel


def test_fp8_param_gather_moves_one_byte_per_fp8_weight_and_casts_the_shard() -> None:
    """ZeRO-1 with fp8_param_gather: the parameter all-gather moves 1 B per GEMM weight of the
    blocks (2 B otherwise); the FP8 weight cast after each block's step covers the rank's 1/dp
    shard of those weights (all of them without fp8_param_gather)."""
    system = load_system(NODE)
    dp, tp = 4, 2
    volume = {}
    casts = {}
    for flag in (False, True):
        graph = load_workload(_workload(layers=2, extra=f",dtype=fp8,fp8_param_gather={str(flag).lower()}"))
        tg = lower_parallel(graph, system, parse_parallel(f"tp={tp},dp={dp},sp=true,zero=1"), COST)
        volume[flag] = sum(c.nbytes for c in tg.collectives if c.kind == "all_gather" and c.group == "dp")
        i = tg.op_names.index("layers.0.fp8_weights")
        casts[flag] = tg.flops[tg.op == i]
    # the block's GEMM weights: qkv (1024 x (16 + 2 x 8) x 64), proj, gate, up, down; one rank's 1/tp
    block = (1024 * (16 + 16) * 64 + 1024 * 1024 + 3 * 1024 * 2048) // tp
    assert volume[False] - volume[True] == pytest.approx(2 * block * (2 - 1), rel=1e-12)  # two blocks
    assert len(casts[True]) == len(casts[False]) == 1
    assert casts[False][0] == pytest.approx(casts[True][0] * dp, rel=1e-12)


def test_fp4_param_gather_moves_the_nvfp4_bytes_of_each_gemm_weight() -> None:
    """ZeRO-1 under NVFP4 with fp4_param_gather (Megatron-Bridge's bf16_with_nvfp4_mixed): the
    parameter all-gather moves 0.5625 B per GEMM weight of the blocks (4 bits and an E4M3 scale per
    16), 2 B without it; fp4_param_gather is the same setting as fp8_param_gather under NVFP4."""
    system = load_system("dgx-b200-cluster:nodes=1")  # NVFP4 needs Blackwell's tensor cores
    dp, tp = 4, 2
    volume = {}
    for extra in ("", ",fp4_param_gather=true", ",fp8_param_gather=true"):
        graph = load_workload(_workload(layers=2, extra=f",dtype=fp4{extra}"))
        tg = lower_parallel(graph, system, parse_parallel(f"tp={tp},dp={dp},sp=true,zero=1"), COST)
        volume[extra] = sum(c.nbytes for c in tg.collectives if c.kind == "all_gather" and c.group == "dp")
    block = (1024 * (16 + 16) * 64 + 1024 * 1024 + 3 * 1024 * 2048) // tp  # as in the FP8 test above
    assert volume[""] - volume[",fp4_param_gather=true"] == pytest.approx(2 * block * (2 - 0.5625), rel=1e-12)
    assert volume[",fp8_param_gather=true"] == volume[",fp4_param_gather=true"]
    with pytest.raises(InputError, match="fp4_param_gather: applies to NVFP4 training"):
        load_workload(_workload(layers=2, extra=",dtype=fp8,fp4_param_gather=true"))


# ---------------------------------------------------------------- the screen and the search


def test_screen_follows_each_setting() -> None:
    """The closed-form screen sees what each setting changes: overlap hides communication, cp
    divides the activations."""
    system = load_system(NODE)
    graph = load_workload(LLAMA.format(layers=2, seq=8192).replace("hidden=1024", "hidden=4096")
                          .replace("ffn=2048", "ffn=8192").replace("heads=16", "heads=32") + ",attention=flash")
    base = screen(graph, system, parse_parallel("tp=8,sp=true"), COST)
    tpo = screen(graph, system, parse_parallel("tp=8,sp=true,tp_comm_overlap=true"), COST)
    dp = screen(graph, system, parse_parallel("tp=4,dp=2,sp=true"), COST)
    cp = screen(graph, system, parse_parallel("tp=4,cp=2,sp=true"), COST)
    assert tpo.iteration_s < base.iteration_s
    assert cp.memory.activations[0] == pytest.approx(dp.memory.activations[0] / 2, rel=1e-12)
    assert math.isfinite(cp.iteration_s) and 0 < cp.iteration_s < dp.iteration_s  # half the sequences per rank


def test_search_genes_and_grid_carry_the_settings() -> None:
    from marssim.search.llm import LLMSearchSettings, LLMSpace, _LLMStrategy, megatron_grid

    system = load_system(NODE)
    graph = load_workload(_workload(layers=4, seq=4096, extra=",attention=flash,batch=4"))
    space = LLMSpace.of(graph, system, LLMSearchSettings(micro_batches=(1,), recompute=("none",)))
    grid = megatron_grid(space)
    assert any(c.cp == 2 for c in grid) and any(c.cp == 4 for c in grid)
    assert all(c.tp_comm_overlap == c.sp for c in grid)
    assert all(c.overlap_p2p_comm == (c.schedule == "interleaved") for c in grid)
    strategy = _LLMStrategy(space, None, space.settings)
    genome = strategy.genome_of(parse_parallel("tp=2,dp=2,cp=2,sp=true,global_batch=4"))
    values = strategy.gene_values(genome)
    assert values["cp"] == (1, 2, 4) and values["tp_comm_overlap"] == (False, True)
    assert genome.config(space).cp == 2 and genome.config(space).dp == 2


# ---------------------------------------------------------------- mixture of experts


MOE = "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=96,experts=4,top_k=2,mode=train"


def test_expert_tensor_parallelism_splits_experts_and_gathers_their_tokens() -> None:
    """tp=2, dp=4, ep=2 on one node. etp=2 (Megatron-LM's default, the tensor-parallel degree):
    each rank holds 4/2 experts at half their weights and all-gathers its experts' tokens over the
    pair; the expert gradients reduce over the dp/ep = 2 replicas. etp=1: whole experts, no
    gather, and their gradients reduce over the 2 tensor-parallel copies times the 2 replicas."""
    from marssim.parallel.memory import rank_parameters
    from marssim.parallel.partition import op_rules

    system = load_system(NODE)
    graph = load_workload(MOE)
    whole = 3 * 256 * 512  # gate, up, down of one expert
    for etp, ring in ((0, 2), (1, 4)):
        cfg = parse_parallel(f"tp=2,dp=4,ep=2,sp=true,etp={etp},bucket=1")  # a bucket per layer
        prepared = prepare_graph(graph, cfg)
        _, experts = rank_parameters(prepared, cfg, op_rules(prepared, cfg))
        assert experts[0] == 4 // 2 * whole // (etp or 2)
        tg = lower_parallel(graph, system, cfg, COST)
        gathers = [c for c in tg.collectives if c.kind == "all_gather" and c.op == "layers.0.moe.dispatch"]
        assert bool(gathers) == (etp != 1)
        expert_rings = {len(c.devices) for c in tg.collectives if c.group == "dp" and c.op.startswith("layers.0.")}
        assert expert_rings == {4, ring}  # the dense weights over dp=4, the experts' over their copies


def test_the_busiest_expert_rank_sets_the_pace() -> None:
    """Routing 3/1/1/1 over 4 experts on ep=2 ranks (experts 0-1 and 2-3): the first rank takes
    4/6 of the tokens, 4/3 of the uniform share; every rank's expert GEMMs and all-to-alls are
    timed at that share: 4/3 of the uniform FLOPs and all-to-all bytes, and a longer iteration."""
    from marssim.parallel.experts import busiest_share

    assert busiest_share((3.0, 1.0, 1.0, 1.0), 2) == pytest.approx(4 / 3)
    assert busiest_share((3.0, 1.0, 1.0, 1.0), 1) == 1 and busiest_share((), 4) == 1
    system = load_system(NODE)
    cfg = parse_parallel("tp=2,dp=4,ep=2,sp=true")
    runs = {}
    for load in ("", ",expert_load=3/1/1/1"):
        graph = load_workload(MOE + load)
        tg = lower_parallel(graph, system, cfg, COST)
        result = simulate(tg, system)
        rep = report_of(tg, system, result, memory=memory_estimate(prepare_graph(graph, cfg), cfg, 80e9),
                        chunks=[[-1, 0, 1, 2]])
        i = tg.op_names.index("layers.0.moe.gate")
        runs[load] = (tg.flops[(tg.op == i) & (tg.kind == COMPUTE)].sum(), rep.stages[0].volume["ep"], result.makespan)
    (f0, v0, t0), (f1, v1, t1) = runs.values()
    assert f1 == pytest.approx(f0 * 4 / 3, rel=1e-12)
    assert v1 == pytest.approx(v0 * 4 / 3, rel=1e-12)
    assert t1 > t0


@pytest.mark.parametrize("config,blocking", [
    ("tp=2,pp=2,dp=2,global_batch=8", True),  # 1F1B: Megatron-LM waits for its sends
    ("tp=2,pp=2,dp=2,global_batch=8,schedule=interleaved,virtual_stages=2", True),
    ("tp=2,pp=2,dp=2,global_batch=8,schedule=interleaved,virtual_stages=2,overlap_p2p_comm=true", False),
])
def test_a_blocking_send_holds_the_senders_next_kernel(config, blocking) -> None:
    """With overlap_p2p_comm off every activation or gradient a GPU sends to another stage is a
    predecessor of that GPU's next kernel; on, no send is."""
    system = load_system(NODE)
    tg = lower_parallel(load_workload(_workload(layers=4)), system, parse_parallel(config), COST, folding=False)
    # the point-to-point sends between stages (not the all-gather of a scattered activation after them)
    pp = [c for c, coll in enumerate(tg.collectives) if coll.group == "pp" and coll.kind == "p2p"]
    sends = np.flatnonzero(np.isin(tg.collective, pp) & (tg.kind != COMPUTE))
    assert len(sends)
    waited = 0
    for t in sends:
        succ = np.flatnonzero(tg.pred_idx == t)  # positions in the CSR list: their targets
        targets = np.searchsorted(tg.pred_ptr, succ, side="right") - 1
        waited += any(tg.kind[x] == COMPUTE and tg.device[x] == tg.src[t] for x in targets)
    assert waited == (len(sends) if blocking else 0)
