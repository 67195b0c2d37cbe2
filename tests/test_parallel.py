"""Parallel configurations on GPU clusters: cluster routes against a graph search, configuration
checks, Megatron-LM's schedules, exact symmetry folding against the full simulation, the
estimate equal to the simulation where nothing contends, the run report's accounting, memory
per GPU against closed forms (Korthikanti et al. 2022), mapping files and the CLI."""

from __future__ import annotations

import itertools

import networkx as nx
import numpy as np
import pytest

from marssim.cli import main
from marssim.cost import default_cost_model
from marssim.errors import InputError
from marssim.parallel import lower_parallel, memory_estimate, parse_parallel, prepare_graph
from marssim.parallel.report import report_of
from marssim.parallel.schedule import stage_units
from marssim.sim import simulate
from marssim.system import load_system
from marssim.workload import load_workload
from support import small_gpu_cluster

COST = default_cost_model()  # analytical GPU roofline for the A100 clusters; shared by the tests


# ---------------------------------------------------------------- clusters


def test_cluster_routes_are_shortest_paths() -> None:
    """Every GPU/host pair: the structural route's latency equals a latency-weighted graph
    search's, and the route is a path of existing links."""
    system = small_gpu_cluster(nodes=4, per_leaf=2, gpus=4)
    graph = system.graph

    def weight(u, v, data):
        sw = system._switch.get(v)
        return data["link"].latency + (sw.latency if sw is not None else 0.0)

    ends = list(system.accelerator_ids) + [h.id for h in system.hosts]
    for a, b in itertools.permutations(ends, 2):
        route = system.route(a, b)
        assert all(graph.has_edge(u, v) for u, v in zip(route.nodes, route.nodes[1:]))
        best = nx.shortest_path_length(graph, a, b, weight=weight)
        assert route.latency == pytest.approx(best, rel=1e-12, abs=1e-15), (a, b, route.nodes)


def test_dominated_links_are_the_non_blocking_uplinks_and_change_no_rate() -> None:
    """A non-blocking fat tree: every leaf-spine direction (and only those) carries no more than
    its leaf's network adapters can feed it (its capacity is their sum), so it is dominated; at
    oversubscription 2 none is. Leaving them out changes no max-min rate (brute-force fair share
    of many cross-spine flows with and without them)."""
    from marssim.parallel.fold import binding_route
    from marssim.sim.network import max_min_rates

    system = small_gpu_cluster(nodes=6, per_leaf=4, gpus=4)
    names = system.resource_names
    uplinks = {i for i, n in enumerate(names) if "spine" in n}
    assert uplinks and system.dominated_links == frozenset(uplinks)
    assert small_gpu_cluster(nodes=6, per_leaf=4, gpus=4, oversubscription=2.0).dominated_links == frozenset()
    gpus = system.accelerator_ids
    pairs = [(gpus[i], gpus[(i * 7 + 5) % len(gpus)]) for i in range(len(gpus))]
    pairs += [(gpus[i], gpus[-1 - i]) for i in range(8)]
    full = [system.route(a, b).resources for a, b in pairs if a != b]
    kept = [binding_route(system, a, b).resources for a, b in pairs if a != b]
    assert any(set(r) & uplinks for r in full) and not any(set(r) & uplinks for r in kept)
    cap = system.resource_capacity
    assert max_min_rates(full, cap) == pytest.approx(max_min_rates(kept, cap), rel=1e-12)


def test_pattern_transfers_wait_the_patterns_largest_latency() -> None:
    """Every data-parallel hop of a ring cut by a partly filled unit waits the hop across the
    spine; an all-to-all's direct sends keep their own latencies."""
    from marssim.parallel.fold import _pattern_sends, latency_floors
    from marssim.parallel.patterns import PULLS
    from marssim.parallel.placement import direct_patterns, place

    system = small_gpu_cluster(nodes=5, per_leaf=2, gpus=4)
    where = place(system, parse_parallel("tp=2,pp=2,dp=5,global_batch=10"))
    patterns = where.patterns()
    sends = list(_pattern_sends(where.gpus, patterns, PULLS))
    floors = latency_floors(system, sends, direct_patterns(patterns))
    names = system.nodes
    dp = [(src, dst) for name, _, src, dst in sends if name == "dp+1"]
    own = [system.route(names[a], names[b]).latency for a, b in dp]
    assert len(set(own)) > 1  # inside a leaf and across the spine
    assert {floors[("dp+1", a, b)] for a, b in dp} == {max(own)}
    moe = place(system, parse_parallel("tp=1,pp=1,dp=20,ep=4,global_batch=20"))
    pats = moe.patterns()
    got = latency_floors(system, list(_pattern_sends(moe.gpus, pats, PULLS)), direct_patterns(pats))
    assert not any(name.startswith("ep+") for name, _, _ in got)


def test_per_task_values_taken_in_runs_equal_the_whole_index() -> None:
    """TaskProgram.take_rows (instance runs of a few tasks) equals indexing by every task's row."""
    system = small_gpu_cluster(nodes=2, per_leaf=2, gpus=4)
    tg = lower_parallel(load_workload("gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64"),
                        system, parse_parallel("tp=2,pp=2,dp=2,global_batch=8"), COST)
    program = tg.__dict__["program"]
    values = np.arange(len(program.rows["duration"]), dtype=np.float64) * 1.5
    want = values[program._rows_of_tasks()]
    for chunk in (1, 7, 1 << 20):
        assert np.array_equal(program.take_rows(values, chunk=chunk), want)


def test_cluster_parameters_and_shipped_sizes() -> None:
    small = load_system("dgx-h100-cluster:nodes=3")
    assert len(small.accelerators) == 24 and small.spec == "dgx-h100-cluster:nodes=3"
    big = load_system("dgx-a100-cluster:nodes=384")
    assert len(big.accelerators) == 3072
    # a GPU's adapter and its rail: 200 Gb/s HDR for A100 = 25 GB/s per direction
    route = big.route("gpu0", "gpu8")
    assert route.nodes == ("gpu0", "leaf0.0", "gpu8")
    assert big.bottleneck_bandwidth("gpu0", "gpu8") == pytest.approx(25e9)
    assert load_system("dgx-h100-cluster").spec == "dgx-h100-cluster"
    with pytest.raises(InputError) as info:
        load_system("dgx-h100-cluster:gpus=8")
    assert info.value.problems[0][0] == "gpus"
    with pytest.raises(InputError) as info:
        load_system("dgx-h100-cluster:nodes=-1")
    assert info.value.problems[0][0] == "nodes"


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize("config,key", [
    ("tp=3,pp=1,dp=8", "tp"),            # does not divide the heads
    ("tp=8,pp=40,dp=1", "pp"),           # more stages than layers (and the product is wrong)
    ("tp=8,pp=1,dp=2", "tp"),            # product is not the GPU count
    ("tp=4,pp=1,dp=2,global_batch=7", "global_batch"),
    ("tp=8,dp=1,schedule=interleaved,virtual_stages=2", "pp"),
    ("tp=8,sp=maybe", "sp"),
    ("tp=8,zero=4", "zero"),
    ("tp=8,schedule=zigzag", "schedule"),
    ("tp=8,order=tp-dp", "order"),
])
def test_bad_configuration_is_one_line_naming_the_key(config, key, capsys) -> None:
    code = main(["simulate", "--system", "dgx-h100-cluster:nodes=1", "--workload",
                 "gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=64,mode=train", "--parallel", config])
    assert code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and key in err[0], err


# ---------------------------------------------------------------- schedules


def test_one_f_one_b_keeps_at_most_pp_minus_stage_micro_batches_in_flight() -> None:
    p, m = 4, 9
    for s in range(p):
        units = stage_units("1f1b", s, p, m)
        assert sorted(u for u in units if u[2] == "F") == [(s, i, "F") for i in range(m)]
        assert sorted(u for u in units if u[2] == "B") == [(s, i, "B") for i in range(m)]
        in_flight = peak = 0
        for _, _, d in units:
            in_flight += 1 if d == "F" else -1
            peak = max(peak, in_flight)
        assert peak == min(p - s, m)
        assert [d for _, _, d in units[:p - s - 1]] == ["F"] * (p - s - 1)  # warm-up


def test_interleaved_order_is_megatrons() -> None:
    """pp=2, v=2, m=4, stage 0, written out by hand from Megatron-LM's rules: 4 warm-up forwards
    ((p-s-1)*2 + (v-1)*p), chunks in groups of p micro-batches, backwards from the last chunk."""
    got = stage_units("interleaved", 0, 2, 4, virtual=2)
    want = [(0, 0, "F"), (0, 1, "F"), (2, 0, "F"), (2, 1, "F"),
            (0, 2, "F"), (2, 0, "B"), (0, 3, "F"), (2, 1, "B"), (2, 2, "F"), (0, 0, "B"), (2, 3, "F"), (0, 1, "B"),
            (2, 2, "B"), (2, 3, "B"), (0, 2, "B"), (0, 3, "B")]
    assert got == want


# ---------------------------------------------------------------- folding is exact


FOLD_CASES = [
    # tensor, pipeline and data parallel on an oversubscribed fabric: the pipeline sends and the
    # gradient all-reduce share the network adapters
    ("oversubscribed", dict(nodes=4, per_leaf=1, gpus=4, oversubscription=4.0),
     "gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=128,mode=train,max_positions=128", "tp=4,pp=2,dp=2,global_batch=8"),
    # sequence parallelism, grouped-query attention, interleaved schedule, distributed optimizer
    ("sp-interleaved-zero", dict(nodes=4, per_leaf=2, gpus=4),
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1000,seq=128,mode=train",
     "tp=2,pp=2,dp=4,sp=true,schedule=interleaved,virtual_stages=2,global_batch=8,zero=1"),
    # data-parallel replicas on both sides of the spine of a partly filled scalable unit, on a
    # non-blocking fabric: the uplinks cannot limit a rate and the ring's hops wait alike, so the
    # classes are the stages
    ("asymmetric-ring", dict(nodes=6, per_leaf=4, gpus=4),
     "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64", "tp=4,pp=2,dp=3,global_batch=6"),
    # the same on an oversubscribed fabric: the uplinks do limit rates, the hops across the spine
    # differ from those inside a leaf, more classes than stages
    ("asymmetric-ring-oversubscribed", dict(nodes=6, per_leaf=4, gpus=4, oversubscription=2.0),
     "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64", "tp=4,pp=2,dp=3,global_batch=6"),
    # units of two nodes of which the last holds one: the data-parallel rings (a replica a node)
    # cross the spine at some positions only; interleaved schedule, distributed optimizer
    ("partial-unit-dp", dict(nodes=5, per_leaf=2, gpus=4),
     "gpt:layers=4,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64",
     "tp=2,pp=2,dp=5,zero=1,schedule=interleaved,virtual_stages=2,global_batch=10"),
    # the same units, a stage a node: some pipeline neighbours sit across the spine
    ("partial-unit-pp", dict(nodes=5, per_leaf=2, gpus=4),
     "gpt:layers=5,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64",
     "tp=4,pp=5,dp=1,global_batch=10"),
    # context parallelism (the key/value ring across nodes) with tensor-parallel overlap and
    # selective recomputation (the ring run again) on an oversubscribed fabric
    ("cp-tp-overlap", dict(nodes=4, per_leaf=1, gpus=4, oversubscription=4.0),
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1000,seq=256,mode=train,attention=flash,"
     "recompute=selective", "tp=2,pp=2,dp=2,cp=2,sp=true,tp_comm_overlap=true,zero=1,global_batch=4"),
    # the parameter all-gather before the forward (FP8 bytes), asynchronous pipeline sends
    ("param-gather-p2p", dict(nodes=4, per_leaf=2, gpus=4),
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1000,seq=128,mode=train,dtype=fp8,"
     "fp8_param_gather=true", "tp=2,pp=2,dp=4,sp=true,zero=1,overlap_param_gather=true,schedule=interleaved,"
                              "virtual_stages=2,overlap_p2p_comm=true,global_batch=8"),
    # experts over the data-parallel group (split over the tensor-parallel pair, etp = tp)
    ("moe", dict(nodes=2, per_leaf=2, gpus=4),
     "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=64,experts=4,top_k=2,mode=train",
     "tp=2,pp=1,dp=4,ep=2,sp=true,global_batch=8"),
    # GPipe: every forward before every backward; the tensor-parallel rings' inputs are freed
    # when their first step has run
    ("gpipe-one-node", "dgx-a100-cluster:nodes=1",
     "gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=128,mode=train,max_positions=128",
     "tp=2,pp=2,dp=2,schedule=gpipe,global_batch=8"),
    # small gradient buckets: the data-parallel rings of several buckets overlap on the network
    # adapters, so a ring's steps change rate while the next step of another starts (a stale
    # finish estimate once ended a folded ring's later step early: 1% faster than the full run)
    ("overlapping-buckets", "dgx-h100-cluster:nodes=4",
     "gpt:layers=8,hidden=1024,heads=16,vocab=2000,seq=256,mode=train,max_positions=256",
     "tp=4,pp=2,dp=4,global_batch=16,bucket=2000000"),
    # whole experts on each of four tensor-parallel ranks, expert tensor parallelism over two of
    # them, uneven routing: the gradients of the copies reduce across nodes
    ("moe-etp-skew", dict(nodes=2, per_leaf=2, gpus=4),
     "moe:layers=2,hidden=256,heads=4,kv_heads=2,ffn=512,vocab=500,seq=64,experts=4,top_k=2,mode=train,"
     "expert_load=3/1/2/1,dtype=fp8", "tp=4,pp=1,dp=2,ep=2,etp=2,sp=true,global_batch=4"),
]


MIXED = "mixed-a100-h100-cluster:nodes_a100=1,nodes_h100=2"
MIXED_CASES = [
    # two GPU kinds: the H100 stage takes three layers, the A100 stage one
    ("mixed-uneven", "mixed-a100-h100-cluster:nodes_a100=2,nodes_h100=2",
     "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1024,seq=128,mode=train",
     "tp=8,pp=2,dp=2,sp=true,stage_start=16/0,layers_per_stage=1/3,global_batch=4"),
    # a stage per kind with its own tensor-parallel degree: the sequence-split activation is
    # gathered before it crosses to the stage of the other degree; the pipeline transfers the
    # tensor-parallel ranks pull cross rails unevenly, so every GPU is its own class here
    ("mixed-degrees", MIXED, "llama:layers=4,hidden=512,heads=8,kv_heads=4,ffn=1024,vocab=1024,seq=128,mode=train",
     "tp=4,pp=2,dp=2,sp=true,stage_tp=4/8,stage_start=0/8,layers_per_stage=1/3,global_batch=4"),
]


@pytest.mark.parametrize("name,cluster,spec,config", FOLD_CASES + MIXED_CASES,
                         ids=[c[0] for c in FOLD_CASES + MIXED_CASES])
def test_folded_simulation_equals_the_full_one(name, cluster, spec, config) -> None:
    system = load_system(cluster) if isinstance(cluster, str) else small_gpu_cluster(**cluster)
    graph = load_workload(spec)
    cfg = parse_parallel(config)
    folded = lower_parallel(graph, system, cfg, COST, folding=True)
    full = lower_parallel(graph, system, cfg, COST, folding=False)
    assert full.meta["fold_classes"] == cfg.gpus == len(system.accelerators)
    if name != "mixed-degrees":
        assert folded.meta["fold_classes"] < full.meta["fold_classes"]
        assert folded.n_tasks < full.n_tasks
    a, b = simulate(folded, system), simulate(full, system)
    # exact: the same float, not merely close (a folded flow's rates are the full network's)
    assert a.makespan == b.makespan
    # every GPU's last kernel ends when its class's representative's does
    fold = folded.meta["fold"]
    last = b.intervals[b.intervals["kind"] == "compute"].groupby("resource")["end"].max()
    last_rep = a.intervals[a.intervals["kind"] == "compute"].groupby("resource")["end"].max()
    for gpu, rep in fold.items():
        assert last[gpu] == last_rep[rep]
    # and the memory peaks are the same
    for gpu, rep in fold.items():
        assert b.memories.loc[gpu, "peak_bytes"] == a.memories.loc[rep, "peak_bytes"]
    if name == "asymmetric-ring-oversubscribed":
        assert folded.meta["fold_classes"] > cfg.pp
    if name == "asymmetric-ring":
        assert folded.meta["fold_classes"] == cfg.pp


def test_contention_is_present_where_folding_is_tested() -> None:
    """The oversubscribed case does contend (else the folded network's weights would go
    untested): its simulation is slower than the contention-free estimate."""
    from marssim.analytical import estimate

    _, cluster, spec, config = FOLD_CASES[0]
    system = small_gpu_cluster(**cluster)
    tg = lower_parallel(load_workload(spec), system, parse_parallel(config), COST)
    assert simulate(tg, system).makespan > estimate(tg, system).makespan * 1.001


# ---------------------------------------------------------------- estimate = simulation without contention


@pytest.mark.parametrize("config", ["tp=8", "tp=2,dp=4,global_batch=4", "tp=8,recompute=full"])
def test_one_node_without_contention_simulates_as_estimated(config) -> None:
    from marssim.analytical import estimate

    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload("gpt:layers=2,hidden=1024,heads=16,vocab=2000,seq=256,mode=train,max_positions=256")
    tg = lower_parallel(graph, system, parse_parallel(config), COST)
    assert simulate(tg, system).makespan == pytest.approx(estimate(tg, system).makespan, rel=1e-12)


# ---------------------------------------------------------------- the report


def test_report_accounts_for_every_second_and_the_bubble_follows_1f1b() -> None:
    system = load_system("dgx-a100-cluster:nodes=2")
    graph = load_workload("gpt:layers=16,hidden=1024,heads=16,vocab=512,seq=256,mode=train,max_positions=256,"
                          "dropout=0")
    p, m = 4, 8
    tg = lower_parallel(graph, system, parse_parallel(f"tp=4,pp={p},dp=1,global_batch={m}"), COST)
    result = simulate(tg, system)
    rep = report_of(tg, system, result)
    for gpu, parts in rep.per_gpu.items():
        total = parts["busy_s"] + sum(v for k, v in parts.items() if k.endswith("_s") and k != "busy_s")
        assert total == pytest.approx(rep.iteration_s, rel=1e-9), gpu
    # equal stages (4 layers each; the embedding and head are small): bubble (p-1)/(m+p-1)
    assert rep.bubble_share == pytest.approx((p - 1) / (m + p - 1), abs=0.03)
    flops = sum(op.flops for op in prepare_graph(graph, parse_parallel(f"tp=4,pp={p},global_batch={m}")).ops
                if op.param("phase") in ("fwd", "bwd"))
    assert rep.model_flops == pytest.approx(flops * m, rel=1e-12)
    assert 0 < rep.mfu < 1


def test_serving_reports_time_to_first_token_and_per_output_token() -> None:
    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload("llama:layers=2,hidden=1024,heads=16,kv_heads=8,ffn=2048,vocab=2000,mode=serve,"
                          "prompt=128,generate=4,batch=2")
    tg = lower_parallel(graph, system, parse_parallel("tp=8,micro_batch=2"), COST)
    rep = report_of(tg, system, simulate(tg, system))
    assert 0 < rep.ttft_s < rep.iteration_s
    assert rep.tpot_s == pytest.approx((rep.iteration_s - rep.ttft_s) / 4, rel=0.05)


# ---------------------------------------------------------------- memory


def test_static_memory_per_rank_is_the_closed_form() -> None:
    h, layers, v, p_pos, tp, pp = 512, 8, 1000, 128, 4, 2
    graph = load_workload(f"gpt:layers={layers},hidden={h},heads=8,vocab={v},seq=128,mode=train,max_positions={p_pos}")
    for zero, dp, grad_type, grad_bytes in ((0, 2, "auto", 4), (1, 2, "auto", 4), (2, 2, "auto", 4),
                                            (3, 2, "auto", 4), (1, 2, "bf16", 2), (2, 2, "bf16", 2)):
        cfg = parse_parallel(f"tp={tp},pp={pp},dp={dp},zero={zero},global_batch=4,grad_reduce_dtype={grad_type}")
        est = memory_estimate(prepare_graph(graph, cfg), cfg, 80 * 2**30)
        per_layer = 12 * h * h // tp + 7 * h // tp + 6 * h  # column weights and biases split, row biases and norms replicated
        vocab_rows = -(-v // tp) * h
        stage0 = (layers // pp) * per_layer + vocab_rows + p_pos * h
        stage1 = (layers // pp) * per_layer + 2 * h + vocab_rows  # final norm, the tied embedding's copy
        for stage, params in ((0, stage0), (1, stage1)):
            st = est.static[stage]
            assert st.weights == pytest.approx(2 * params / (dp if zero >= 3 else 1))
            # the main gradients' buffer: fp32 by default for bf16 training, bf16 with grad_reduce_dtype=bf16
            assert st.gradients == pytest.approx(grad_bytes * params / (dp if zero >= 2 else 1))
            assert st.optimizer == pytest.approx(12 * params / (dp if zero >= 1 else 1))


@pytest.mark.parametrize("sp", [False, True])
def test_activation_memory_of_a_middle_stage_is_korthikantis_with_tensor_parallelism(sp) -> None:
    """Per layer, 16-bit activations, t-way tensor parallelism: s*b*h*(10 + 24/t + 5*a*s/(h*t)),
    with sequence parallelism s*b*h*(34/t + 5*a*s/(h*t)) (Korthikanti et al. 2022, eqs. 2-4);
    1F1B keeps pp - stage micro-batches on a stage."""
    s, b, h, a, t, layers, pp = 128, 1, 512, 8, 4, 8, 4
    graph = load_workload(f"gpt:layers={layers},hidden={h},heads={a},vocab=1000,seq={s},batch={b},mode=train,"
                          f"max_positions={s}")
    cfg = parse_parallel(f"tp={t},pp={pp},global_batch=8,sp={str(sp).lower()}")
    est = memory_estimate(prepare_graph(graph, cfg), cfg, 80 * 2**30)
    per_layer = s * b * h * ((34 / t) if sp else (10 + 24 / t)) + 5 * a * s * s * b / t
    for stage in (1, 2):
        assert est.activations[stage] == pytest.approx(per_layer * layers / pp * (pp - stage), rel=1e-12)


def test_a_run_that_does_not_fit_names_the_gpu_peak_capacity_and_largest_term(capsys) -> None:
    code = main(["simulate", "--system", "dgx-a100-cluster:nodes=1", "--workload", "gpt3-175b:mode=train,seq=2048",
                 "--parallel", "tp=8"])
    assert code == 2  # the user's plan: input like any other
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "error: the plan does not fit" in err
    assert "gpu0" in err and "capacity 80.00 GiB" in err and "largest term optimizer state" in err
    assert "t=" not in err  # checked before simulating: there is no time of an overflow


# ---------------------------------------------------------------- files and CLI


def test_mapping_file_with_a_parallel_section_round_trips(tmp_path, capsys) -> None:
    from marssim.plan import load_plan, save_plan

    system = load_system("dgx-a100-cluster:nodes=2")
    graph = load_workload("gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=64,mode=train,max_positions=64")
    cfg = parse_parallel("tp=4,pp=2,dp=2,global_batch=8,layers_per_stage=1/3")
    path = save_plan(cfg, graph, system, tmp_path / "run.yaml")
    loaded, g2, s2 = load_plan(path)
    assert loaded == cfg.with_(micro_batch=graph.batch) and s2.spec == "dgx-a100-cluster:nodes=2"
    assert g2.spec == graph.spec
    assert main(["simulate", "--mapping", str(path)]) == 0
    out = capsys.readouterr().out
    assert "iteration" in out and "MFU" in out


def test_cli_reports_a_parallel_run_and_traces_the_gpus_asked_for(tmp_path, capsys) -> None:
    trace = tmp_path / "t.json"
    code = main(["simulate", "--system", "dgx-a100-cluster:nodes=2", "--workload",
                 "gpt:layers=4,hidden=512,heads=8,vocab=1000,seq=64,mode=train,max_positions=64",
                 "--parallel", "tp=4,pp=2,dp=2,global_batch=8", "--trace", str(trace), "--trace-gpus", "gpu[0-3],gpu9"])
    assert code == 0
    out = capsys.readouterr().out
    for words in ("iteration", "MFU", "pipeline bubble", "exposed comm.", "memory peak"):
        assert words in out
    import json

    events = json.loads(trace.read_text())["traceEvents"]
    pid_of = {e["args"]["name"].split()[0]: e["pid"] for e in events
              if e.get("ph") == "M" and e.get("name") == "process_name"}
    slices = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") == "compute":
            slices[e["pid"]] = slices.get(e["pid"], 0) + 1
    per_gpu = {g: slices.get(pid_of[g], 0) for g in ("gpu0", "gpu1", "gpu2", "gpu3", "gpu9", "gpu5")}
    # the GPUs asked for show their class representative's kernels; gpu5 (not asked, not a representative) none
    assert per_gpu["gpu0"] > 0 and per_gpu["gpu1"] == per_gpu["gpu2"] == per_gpu["gpu3"] == per_gpu["gpu0"]
    assert per_gpu["gpu9"] > 0 and per_gpu["gpu5"] == 0


def test_every_timed_op_names_its_cost_model_in_every_lowering() -> None:
    """Shard timings are shared between lowerings of one graph; the label of the cost model
    that timed an op must come with them, in the first lowering and in a repeated one."""
    from marssim.taskgraph import COMPUTE

    system = load_system("dgx-a100-cluster:nodes=1")
    graph = load_workload("gpt:layers=2,hidden=256,heads=8,vocab=1000,seq=64,batch=2,mode=train")
    cfg = parse_parallel("tp=8,micro_batch=2")
    cost = default_cost_model()
    labels = []
    for _ in range(2):
        tg = lower_parallel(graph, system, cfg, cost)
        timed = {tg.op_names[i] for i in tg.op[(tg.kind == COMPUTE) & (tg.op >= 0)].tolist()}
        label = {o.name: o.cost_model for o in tg.ops}
        assert timed and not [name for name in timed if not label.get(name)]
        labels.append(label)
    assert labels[0] == labels[1]
