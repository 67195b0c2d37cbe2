"""What a Megatron-LM iteration runs beyond the graph (``marssim.parallel.megatron``) and the
collectives of the parallel lowering as NCCL runs them (``marssim.collectives.group``): closed
forms of the kernels' bytes from Megatron-LM's code, each switch against its default, the plans'
times in the lowering, the screen and the estimate, and the collectives the optimizer step adds."""

from __future__ import annotations

import math

import numpy as np
import pytest

from marssim.analytical import estimate
from marssim.collectives.group import group_plan, hop_step, route_bottleneck
from marssim.errors import InputError
from marssim.parallel import lower_parallel, parse_parallel
from marssim.parallel.config import check_parallel
from marssim.parallel.memory import memory_estimate
from marssim.parallel.partition import prepare_graph
from marssim.parallel.analytic import screen_model
from marssim.parallel.unittimer import UnitTimer
from marssim.parallel.megatron import (PERSIST_LN_HIDDEN_SIZES, grad_dtype, op_kernels, optimizer_kernels, roles,
                                       softmax_fused)
from marssim.system import load_system
from marssim.taskgraph import COMPUTE
from marssim.workload import load_workload
from marssim.workload.llm import transformer_of

GPT = "gpt:layers=2,hidden=1024,heads=16,seq=512,vocab=8192,max_positions=512,mode=train,batch=2"
LLAMA = "llama:layers=2,hidden=1024,heads=16,kv_heads=4,ffn=2816,seq=512,vocab=8192,mode=train,batch=2"


@pytest.fixture(scope="module")
def node():
    return load_system("dgx-a100-cluster:nodes=1")


# ------------------------------------------------------------------ collectives of the lowering
def test_a_step_alone_on_its_route_takes_the_plans_time_per_step(node):
    devices = [f"gpu{i}" for i in range(8)]
    for kind, size in (("all_reduce", 2 ** 20), ("all_reduce", 96 * 2 ** 20), ("all_gather", 3 * 2 ** 24),
                       ("reduce_scatter", 2 ** 28)):
        plan = group_plan(node, devices, kind, size)
        route = node.route("gpu0", "gpu1")
        bw = route_bottleneck(node.resource_capacity, route.resources)
        hop = hop_step(plan, bw, route.latency)
        assert hop.time * plan.steps == pytest.approx(plan.time, rel=1e-12)
        assert hop.latency >= route.latency
        # NCCL stays below the NVLink line rate on A100 (measured curves): each byte weighs more than one
        assert hop.factor > 1
    # a route slower than the plan's line rate carries the step's bytes at a factor below one
    plan = group_plan(node, devices, "all_reduce", 2 ** 28)
    slow = hop_step(plan, plan.line_bandwidth / 8, 0.0)
    assert slow.factor < 1 and slow.time * plan.steps == pytest.approx(plan.time, rel=1e-12)


def test_groups_outside_a_cluster_have_no_plan():
    system = load_system("ring-8")
    assert group_plan(system, [a for a in system.accelerator_ids[:2]], "all_reduce", 2 ** 20) is None


def _tp_all_reduce(tg, est):
    """(nbytes, seconds) of the first tensor-parallel all-reduce of the forward."""
    for c, coll in enumerate(tg.collectives):
        if coll.group == "tp" and coll.kind == "all_reduce" and "attn.proj" in coll.op:
            rows = np.flatnonzero(tg.collective == c)
            return coll, float(est.end[rows].max() - est.start[rows].min())
    raise AssertionError("no tensor-parallel all-reduce")


@pytest.mark.parametrize("folding", [True, False])
def test_the_lowering_runs_a_tensor_parallel_all_reduce_in_the_plans_time(node, cost, folding):
    graph = load_workload(GPT)
    cfg = parse_parallel("tp=8,micro_batch=2")
    tg = lower_parallel(graph, node, cfg, cost, folding=folding)
    coll, seconds = _tp_all_reduce(tg, estimate(tg, node))
    plan = group_plan(node, list(coll.devices), "all_reduce", coll.nbytes)
    assert coll.nbytes == 2 * 512 * 1024 * 2 and coll.steps == plan.steps and coll.algorithm == plan.algorithm
    assert seconds == pytest.approx(plan.time, rel=1e-9)
    # the old model, at the links' line rate, on request
    line = lower_parallel(graph, node, parse_parallel("tp=8,micro_batch=2,collectives=line"), cost, folding=folding)
    _, at_line = _tp_all_reduce(line, estimate(line, node))
    route = node.route("gpu0", "gpu1")
    assert at_line == pytest.approx(14 * (route.latency + coll.nbytes / 8 / 300e9), rel=1e-9)
    assert seconds > at_line


def test_the_screen_times_a_ring_as_the_lowering_does(node, cost):
    graph = load_workload(GPT)
    cfg = parse_parallel("tp=8,micro_batch=2")
    low, _, rep = screen_model(graph, node, cfg, cost)
    timer = UnitTimer(low, rep[0])
    size = 2 * 512 * 1024 * 2
    plan = group_plan(node, [f"gpu{i}" for i in range(8)], "all_reduce", size)
    assert timer.ring("tp+1", 8, size, "all_reduce") == pytest.approx(plan.time, rel=1e-12)


# ------------------------------------------------------------------ which ops run which kernels
def test_roles_follow_megatrons_bias_handling():
    r = roles(load_workload(GPT + ",recompute=full"))
    for i in range(2):
        p = f"layers.{i}."
        assert r[p + "attn.qkv"] == ("linear_bias",)  # ColumnParallelLinear adds its own bias
        assert r[p + "attn.qkv.wgrad"] == ("bias_grad",)
        assert r[p + "mlp.act"] == ("gelu_bias",) and r[p + "mlp.act.grad"] == ("bias_grad",)
        for d, a in (("attn.proj_dropout", "attn.residual"), ("mlp.dropout", "mlp.residual")):
            assert r[p + d] == ("bda",) and r[p + a] == ("bda_add",) and r[p + d + ".grad"] == ("bias_grad",)
            assert r[p + d + ".recompute"] == ("bda",) and r[p + a + ".recompute"] == ("bda_add",)
        assert r[p + "attn.softmax"] == ("softmax",) and r[p + "attn.softmax.grad"] == ("softmax_grad",)
        assert r[p + "input_norm"] == ("layer_norm",) and r[p + "input_norm.grad"] == ("layer_norm",)
        assert "mlp.fc1" not in " ".join(k for k in r if r[k] == ("linear_bias",) and k.startswith(p + "mlp"))
    # Llama: no biases, RMSNorm, no dropout: nothing but the softmax
    assert {v for v in roles(load_workload(LLAMA)).values()} <= {("softmax",), ("softmax_grad",)}


def _part(graph, name):
    return graph.op(name)


def test_bias_dropout_add_is_one_pass_and_its_add_runs_no_kernel():
    graph = load_workload(GPT)
    r = roles(graph)
    d, a = graph.op("layers.0.attn.proj_dropout"), graph.op("layers.0.attn.residual")
    fused = parse_parallel("tp=1")
    (k,) = op_kernels(d, d, r[d.name], fused)
    elems = d.out_elems
    # reads the projection's output and the residual, writes the sum and the one-byte mask, reads the bias
    assert k.bytes_moved == 2 * (2 * elems) + 2 * elems + elems + 2 * d.dim("C")
    assert op_kernels(a, a, r[a.name], fused) == ()
    unfused = parse_parallel("tp=1,bias_dropout_fusion=false")
    bias_add, own = op_kernels(d, d, r[d.name], unfused)
    assert own is d and bias_add.bytes_moved == 2 * (2 * elems) + 2 * d.dim("C")
    assert op_kernels(a, a, r[a.name], unfused) == (a,)


def test_bias_gelu_and_the_linear_bias():
    graph = load_workload(GPT)
    r = roles(graph)
    act, qkv = graph.op("layers.0.mlp.act"), graph.op("layers.0.attn.qkv")
    assert op_kernels(act, act, r[act.name], parse_parallel("tp=1")) == (act,)
    bias_add, own = op_kernels(act, act, r[act.name], parse_parallel("tp=1,bias_gelu_fusion=false"))
    assert own is act and bias_add.bytes_moved == 4 * act.out_elems + 2 * act.dim("C")
    gemm, add = op_kernels(qkv, qkv, r[qkv.name], parse_parallel("tp=1"))
    assert gemm is qkv and add.bytes_moved == 4 * qkv.out_elems + 2 * qkv.dim("N")
    wgrad = graph.op("layers.0.attn.qkv.wgrad")
    own, reduce = op_kernels(wgrad, wgrad, r[wgrad.name], parse_parallel("tp=1"))
    tokens, features = wgrad.dim("B") * wgrad.dim("M"), wgrad.dim("N")  # dY it reads, reduced over the tokens
    assert own is wgrad and reduce.bytes_moved == 2 * tokens * features + 2 * features


def test_the_unfused_softmax_adds_the_casts_scale_and_mask():
    graph = load_workload(GPT)
    r = roles(graph)
    sm = graph.op("layers.0.attn.softmax")
    assert softmax_fused(sm, parse_parallel("tp=1")) and op_kernels(sm, sm, r[sm.name], parse_parallel("tp=1")) == (sm,)
    kernels = op_kernels(sm, sm, r[sm.name], parse_parallel("tp=1,masked_softmax_fusion=false"))
    assert kernels[0] is sm
    # to fp32 (2 + 4 B), scale (4 + 4), mask (4 + 4), back to 16 bits (4 + 2) per score
    assert sum(k.bytes_moved for k in kernels[1:]) == 28 * sm.out_elems
    long = load_workload("gpt:layers=1,hidden=256,heads=4,seq=8192,vocab=1024,max_positions=8192,mode=train")
    assert not softmax_fused(long.op("layers.0.attn.softmax"), parse_parallel("tp=1"))  # keys > 4096


def test_the_persistent_layer_norm_is_one_pass_where_its_hidden_size_allows():
    graph = load_workload(GPT)
    r = roles(graph)
    ln, grad = graph.op("layers.0.input_norm"), graph.op("layers.0.input_norm.grad")
    assert 1024 in PERSIST_LN_HIDDEN_SIZES
    (k,) = op_kernels(ln, ln, r[ln.name], parse_parallel("tp=1"))
    assert k.bytes_moved == 2 * (2 * ln.out_elems) + 2 * 2 * 1024
    (kg,) = op_kernels(grad, grad, r[grad.name], parse_parallel("tp=1"))
    assert kg.bytes_moved == 3 * (2 * grad.out_elems) + 2 * 2 * 1024
    assert op_kernels(ln, ln, r[ln.name], parse_parallel("tp=1,persist_layer_norm=false")) == (ln,)
    odd = load_workload("gpt:layers=1,hidden=1000,heads=8,seq=64,vocab=1024,mode=train")
    o = odd.op("layers.0.input_norm")
    assert op_kernels(o, o, roles(odd)[o.name], parse_parallel("tp=1")) == (o,)


@pytest.mark.parametrize("dtype, per_param", [("fp16", 6 + 8 + 4 + 28 + 6 + 2), ("bf16", 4 + 28 + 6 + 4)])
def test_the_optimizer_step_moves_what_megatrons_step_moves(dtype, per_param):
    """Float16OptimizerWithFloat16Params.step: fp32 copy of the gradient (fp16's buffer), unscale
    (fp16's loss scaler), the norm, FusedAdam, the copy to the 16-bit weight, the buffer zeroed."""
    t = transformer_of(load_workload(GPT.replace("batch=2", f"dtype={dtype}")))
    n = 1000
    before, after = optimizer_kernels("g", n, t, parse_parallel("tp=1"))
    assert sum(k.bytes_moved for k in before + after) == per_param * n + 4  # and the norm, one fp32 value
    _, clipped = optimizer_kernels("g", n, t, parse_parallel("tp=1,grads_clipped=true"))
    assert sum(k.bytes_moved for k in clipped) - sum(k.bytes_moved for k in after) == 8 * n
    _, torch_adam = optimizer_kernels("g", n, t, parse_parallel("tp=1,fused_adam=false"))
    assert sum(k.bytes_moved for k in torch_adam) - sum(k.bytes_moved for k in after) == (80 - 28) * n
    nothing, _ = optimizer_kernels("g", n, t, parse_parallel("tp=1,clip_grad=0"))
    assert (sum(k.bytes_moved for k in nothing) == (6 + 8) * n) if dtype == "fp16" else not nothing


def test_a_bf16_optimizer_state_updates_the_bf16_weights_in_place_with_bf16_moments():
    """optimizer_dtype=bf16 (Apex's DistributedFusedAdam with dtype bf16): the norm reads the fp32
    gradient (4 B), the Adam step reads it with the bf16 weight and moments (4 + 3 x 2) and writes the
    three (3 x 2), no copy to a 16-bit weight, the buffer zeroed (4); 4 B of state a parameter in the
    memory check, 12 B with the fp32 default; the unfused AdamW has no bf16 state."""
    t = transformer_of(load_workload(GPT))
    n = 1000
    before, after = optimizer_kernels("g", n, t, parse_parallel("tp=1,optimizer_dtype=bf16"))
    assert sum(k.bytes_moved for k in before + after) == (4 + (4 + 6 + 6) + 4) * n + 4
    (adam,) = [k for k in after if k.param("fn") == "adam"]
    assert adam.bytes_moved == 16 * n
    assert not any(k.name.endswith((".to_model", ".grad_to_fp32")) for k in before + after)
    # a bf16 gradient buffer is read as it is: the norm 2, Adam 2 + 6 + 6, the buffer zeroed 2
    before, after = optimizer_kernels("g", n, t, parse_parallel("tp=1,optimizer_dtype=bf16,grad_reduce_dtype=bf16"))
    assert sum(k.bytes_moved for k in before + after) == (2 + (2 + 6 + 6) + 2) * n + 4
    graph = load_workload(GPT)
    for opt, per in (("fp32", 12), ("bf16", 4)):
        cfg = parse_parallel(f"tp=1,dp=2,zero=1,global_batch=4,optimizer_dtype={opt}")
        st = memory_estimate(prepare_graph(graph, cfg), cfg, 80 * 2**30).static[0]
        assert st.optimizer == pytest.approx(per * st.gradients / 4 / 2)  # gradients: 4 B a parameter, unsharded
    with pytest.raises(InputError, match="optimizer_dtype"):
        check_parallel(parse_parallel("tp=1,optimizer_dtype=bf16,fused_adam=false"), t, 1)
    fp16 = transformer_of(load_workload(GPT + ",dtype=fp16"))
    with pytest.raises(InputError, match="optimizer_dtype: a bf16 state"):
        check_parallel(parse_parallel("tp=1,optimizer_dtype=bf16"), fp16, 1)


def test_one_graph_estimated_with_either_optimizer_state_times_each_as_its_own(cost):
    """The lowering's per-graph caches tell the two optimizer states apart: estimating the same
    graph object with fp32, then bf16, then fp32 state gives the bf16 step its own (shorter) Adam
    kernels and the fp32 step the same time both times."""
    from marssim.plan import run as run_plan

    system = load_system("dgx-h100-cluster:nodes=1")
    graph = load_workload("llama3-8b:mode=train,seq=512,layers=2")
    times = []
    for opt in ("fp32", "bf16", "fp32"):
        cfg = parse_parallel(f"tp=1,dp=8,zero=1,micro_batch=1,global_batch=8,optimizer_dtype={opt}")
        times.append(run_plan(cfg, graph, system, cost, how="estimate", detail=False).report.iteration_s)
    assert times[0] == times[2] and times[1] < times[0]


def test_gradient_buffer_type_is_megatrons():
    cfg = parse_parallel("tp=1")
    bf16 = transformer_of(load_workload(GPT))
    fp16 = transformer_of(load_workload(GPT + ",dtype=fp16"))
    assert grad_dtype(cfg, bf16) == "fp32" and grad_dtype(cfg, fp16) == "fp16"
    assert grad_dtype(parse_parallel("tp=1,grad_reduce_dtype=bf16"), bf16) == "bf16"


# ------------------------------------------------------------------ what the lowering adds
def _colls(tg, group):
    return [c for c in tg.collectives if c.group == group]


def test_the_data_parallel_reduction_runs_in_the_gradient_buffers_type(cost):
    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload(GPT)
    for setting, width in (("", 4), (",grad_reduce_dtype=bf16", 2)):
        cfg = parse_parallel("tp=2,dp=4,micro_batch=2,global_batch=8" + setting)
        tg = lower_parallel(graph, system, cfg, cost, folding=False)
        low, _, _ = screen_model(graph, system, cfg, cost)
        rep = tg.node_names.index("gpu0")
        sent = sum(c.nbytes for c in _colls(tg, "dp") if c.devices[0] == tg.node_names[rep])
        assert sent == pytest.approx(width * sum(low.opt_params.values()))


def test_the_tied_embedding_is_all_reduced_between_first_and_last_stage(cost):
    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload(GPT)
    cfg = parse_parallel("tp=2,pp=2,dp=2,micro_batch=2,global_batch=8")
    tg = lower_parallel(graph, system, cfg, cost, folding=False)
    emb = _colls(tg, "emb")
    assert emb and all(c.kind == "all_reduce" and c.nbytes == 4 * (8192 // 2) * 1024 for c in emb)
    assert len(emb) == 8  # each GPU of the first and of the last stage, one each
    # Llama's output layer is its own: nothing to all-reduce
    llama = lower_parallel(load_workload(LLAMA), system, cfg, cost, folding=False)
    assert not _colls(llama, "emb")


@pytest.mark.parametrize("dtype, clip, count", [("bf16", "", 1), ("fp16", "", 2), ("bf16", ",clip_grad=0", 0),
                                                 ("fp16", ",clip_grad=0", 1)])
def test_the_optimizer_step_all_reduces_the_norm_and_the_inf_flag(cost, dtype, clip, count):
    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload(GPT + f",dtype={dtype}")
    cfg = parse_parallel("tp=2,pp=2,dp=2,micro_batch=2,global_batch=8" + clip)
    tg = lower_parallel(graph, system, cfg, cost, folding=False)
    mp = _colls(tg, "mp")
    assert len(mp) == count * 8 and all(c.nbytes == 4 for c in mp)
    if mp:  # over the model-parallel group of 4 GPUs (2 stages x 2 tensor-parallel ranks): NCCL's plan
        est = estimate(tg, system)
        c = tg.collectives.index(mp[0])
        row = int(np.flatnonzero(tg.collective == c)[0])
        plan = group_plan(system, ["gpu0", "gpu1", "gpu4", "gpu5"], "all_reduce", 4.0)
        assert est.end[row] - est.start[row] == pytest.approx(plan.time, rel=1e-9)


def test_pipeline_activations_are_scattered_and_gathered_without_sequence_parallelism(cost):
    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload(GPT)
    activation = 2 * 512 * 1024 * 2  # one micro-batch's hidden states, bf16

    def pp_bytes(setting):
        tg = lower_parallel(graph, system, parse_parallel("tp=4,pp=2,micro_batch=2,global_batch=4" + setting), cost,
                            folding=False)
        p2p = [c for c in tg.collectives if c.kind == "p2p" and c.group == "pp"]
        gathers = [c for c in tg.collectives if c.kind == "all_gather" and c.group == "pp"]
        return {c.nbytes for c in p2p}, {c.nbytes for c in gathers}

    assert pp_bytes("") == ({activation / 4}, {activation})
    assert pp_bytes(",scatter_gather=false") == ({activation}, set())
    assert pp_bytes(",sp=true") == ({activation / 4}, set())  # split already: nothing to gather


def test_defaults_change_no_result_they_do_not_name(cost, node):
    """Every switch at its default is the configuration without it."""
    graph = load_workload(GPT + ",dtype=fp16")
    base = lower_parallel(graph, node, parse_parallel("tp=8,micro_batch=2"), cost)
    same = lower_parallel(graph, node, parse_parallel(
        "tp=8,micro_batch=2,collectives=nccl,bias_gelu_fusion=true,bias_dropout_fusion=true,"
        "masked_softmax_fusion=true,persist_layer_norm=true,fused_adam=true,clip_grad=1,grads_clipped=false,"
        "grad_reduce_dtype=auto,scatter_gather=true"), cost)
    assert estimate(base, node).makespan == estimate(same, node).makespan
    slower = lower_parallel(graph, node, parse_parallel("tp=8,micro_batch=2,bias_dropout_fusion=false,"
                                                        "masked_softmax_fusion=false,fused_adam=false"), cost)
    assert estimate(slower, node).makespan > estimate(base, node).makespan
    assert math.isfinite(estimate(slower, node).makespan)
    compute = (base.kind == COMPUTE)
    assert (base.duration[compute] >= 0).all()


# ------------------------------------------------------------------ host launch gaps
def test_launch_gaps_closed_forms():
    from marssim.parallel.host import launch_gaps

    us = 1e-6
    # kernels longer than a launch: only the first waits, for its own launch
    assert launch_gaps([10 * us] * 3, [1] * 3, us) == pytest.approx([us, 0, 0])
    # shorter ones: the host sets the pace, one launch per kernel
    gaps = launch_gaps([0.2 * us] * 3, [1] * 3, us)
    assert gaps == pytest.approx([us, 0.8 * us, 0.8 * us])
    assert sum(gaps) + 0.6 * us == pytest.approx(3 * us + 0.2 * us)
    # a task of three kernels waits as three tasks of one; a task of no kernel never waits
    assert sum(launch_gaps([0.6 * us], [3], us)) == pytest.approx(sum(gaps))
    assert launch_gaps([0.0, 5 * us], [0, 1], us) == pytest.approx([0.0, us])


def test_the_launch_time_is_the_measured_host_forward_over_its_kernels():
    from marssim.parallel.host import MODEL_LAYERS, VIDUR_KERNELS_PER_LAYER, launch_seconds

    launch = launch_seconds("A100", "vidur-2024")
    assert 0.5e-6 < launch < 3e-6  # a host forward of 80 layers in about 1.4 ms (the shipped table)
    assert launch_seconds("H100", "pytorch-2.11.0+cu130") == 0.0  # no host measurement: no gaps
    assert launch * MODEL_LAYERS["meta-llama/Llama-2-70b-hf"] * (VIDUR_KERNELS_PER_LAYER + 2) == \
        pytest.approx(1.4e-3, rel=0.2)


def test_host_gaps_slow_short_kernels_only(cost, node):
    tiny = load_workload("gpt:layers=2,hidden=64,heads=2,seq=16,vocab=256,max_positions=16,mode=train,batch=1")
    big = load_workload(GPT.replace("batch=2", "batch=1"))
    cost_of = {}
    for name, graph in (("tiny", tiny), ("big", big)):
        on = lower_parallel(graph, node, parse_parallel("tp=2,pp=2,dp=2,micro_batch=1"), cost)
        off = lower_parallel(graph, node, parse_parallel("tp=2,pp=2,dp=2,micro_batch=1,host_gaps=false"), cost)
        compute = on.kind == COMPUTE
        gaps = on.duration[compute] - off.duration[compute]
        assert (gaps >= -1e-15).all() and gaps.max() > 0  # every unit's first kernel waits for its launch
        cost_of[name] = estimate(on, node).makespan / estimate(off, node).makespan - 1
        assert cost_of[name] >= 0
    assert cost_of["tiny"] > 2 * cost_of["big"]


# ------------------------------------------------------------------ the per-op lowering shares the plans
def test_the_per_op_lowering_runs_nccls_plan_on_a_cluster_and_its_own_schedules_elsewhere(node, cost):
    from marssim.lower import lower
    from marssim.mapping import Mapping

    graph = load_workload("gpt:layers=1,hidden=1024,heads=16,seq=512,vocab=8192,max_positions=512,batch=2")
    devices = tuple(f"gpu{i}" for i in range(4))
    for requested in ("auto", "ring"):
        m = Mapping.single_set(graph, node, devices=devices, sharding=("ic", "dp"), collective_algorithm=requested)
        tg = lower(graph, node, m, cost)
        est = estimate(tg, node)
        reduces = [c for c, coll in enumerate(tg.collectives) if coll.kind in ("all_reduce", "reduce_scatter")]
        assert reduces
        c = reduces[0]
        coll = tg.collectives[c]
        rows = np.flatnonzero(tg.collective == c)
        seconds = float(est.end[rows].max() - est.start[rows].min())
        plan = group_plan(node, list(coll.devices), coll.kind, coll.nbytes)
        if requested == "auto":  # NCCL's algorithm, its steps, its time
            assert coll.algorithm == plan.algorithm and coll.steps == plan.steps
            assert seconds == pytest.approx(plan.time, rel=1e-9)
        else:  # the ring the mapping names, at the links' line rate: faster than NCCL on A100
            assert coll.algorithm == "ring" and seconds < plan.time
