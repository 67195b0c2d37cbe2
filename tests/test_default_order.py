"""The rank order a configuration takes when it names none: on GB200 NVL72 (one NVLink domain per
rack of 72 GPUs) the data-parallel groups stay inside a rack and the order is the best of the
legal ones by the closed-form screen; on DGX clusters it stays ``tp-pp-dp``, except that the
expert-parallel groups of a pipelined mixture of experts stay inside a server; a named order is
kept, and a saved plan reads back to the same order."""

from __future__ import annotations

import pytest

from marssim.cost import default_cost_model
from marssim.parallel import ORDERS, ParallelConfig, parse_parallel
from marssim.parallel.analytic import screen
from marssim.parallel.placement import default_order, place
from marssim.plan import bind_parallel
from marssim.plan.io import plan_to_dict
from marssim.system import load_system
from marssim.workload import load_workload

README = "tp=8,pp=2,dp=9,sp=true,zero=1,recompute=full,global_batch=72"  # README's GB200 NVL72 command
LLAMA = "llama3-70b:mode=train,seq=4096,dtype=fp8"


def _bind(system, workload, text, order_given):
    return bind_parallel(parse_parallel(text), load_workload(workload), system, "--parallel", micro_batch_given=False,
                         batch_given=False, order_given=order_given)


@pytest.fixture(scope="module")
def gb200():
    return load_system("gb200-nvl72:racks=2")


def test_gb200_default_keeps_data_parallel_groups_in_a_rack(gb200):
    cfg, _ = _bind(gb200, LLAMA, README, order_given=False)
    where = place(gb200, cfg)
    racks: dict[tuple[int, int], set[int]] = {}
    for (dp, pp, tp), node in where.ranks.items():
        racks.setdefault((pp, tp), set()).add(gb200.cluster_node(gb200.nodes[node])[0])
    assert len(racks) == cfg.pp * cfg.tp and all(len(r) == 1 for r in racks.values())
    # the old default sends every data-parallel ring across the two racks
    old = place(gb200, cfg.with_(order="tp-pp-dp"))
    crossing = {(pp, tp) for (dp, pp, tp), node in old.ranks.items()
                if gb200.cluster_node(gb200.nodes[node])[0] != gb200.cluster_node(gb200.nodes[old.at(0, pp, tp)])[0]}
    assert crossing


def test_gb200_default_is_the_best_legal_order_by_the_screen(gb200):
    cost = default_cost_model()
    default, graph = _bind(gb200, LLAMA, README, order_given=False)
    times = {}
    for order in ORDERS:
        cfg, g = _bind(gb200, LLAMA, README + f",order={order}", order_given=True)
        times[order] = screen(g, gb200, cfg, cost).iteration_s
    assert times[default.order] == min(times.values())
    assert times[default.order] < times["tp-pp-dp"] * 0.9


@pytest.mark.parametrize("system, workload, text", [
    ("dgx-h100-cluster:nodes=16", "llama3-70b:mode=train,seq=4096", "tp=8,pp=2,dp=8,sp=true,zero=1,global_batch=64"),
    ("dgx-h100-cluster:nodes=2", "llama3-8b:mode=train,seq=4096", "tp=4,pp=2,dp=2,sp=true,global_batch=8"),
])
def test_dgx_clusters_keep_tp_pp_dp(system, workload, text):
    cfg, _ = _bind(load_system(system), workload, text, order_given=False)
    assert cfg.order == "tp-pp-dp" == ParallelConfig().order


def test_a_named_order_is_kept_and_a_saved_plan_reads_back_the_same(gb200):
    named, graph = _bind(gb200, LLAMA, README + ",order=tp-pp-dp", order_given=True)
    assert named.order == "tp-pp-dp" and default_order(gb200, named) == "tp-dp-pp"
    saved = plan_to_dict(named, graph, gb200)["parallel"]
    assert saved["order"] == "tp-pp-dp"  # written although it is the field's default: read back it must hold
    again, _ = bind_parallel(parse_parallel(saved), graph, gb200, "file", micro_batch_given="micro_batch" in saved,
                             batch_given=False, order_given="order" in saved)
    assert again == named


MOE = "qwen3-30b-a3b:mode=train,seq=4096,layers=8"


def _domains(system, where, group_of):
    out: dict[tuple, set] = {}
    for (dp, pp, tp), node in where.ranks.items():
        out.setdefault(group_of(dp, pp, tp), set()).add(system.cluster_node(system.nodes[node])[0])
    return out


@pytest.mark.parametrize("text", ["pp=2,dp=8,ep=8,global_batch=16", "pp=4,dp=4,ep=4,global_batch=16",
                                  "tp=2,pp=2,dp=4,ep=4,sp=true,global_batch=8"])
def test_dgx_default_keeps_expert_parallel_groups_in_a_server(text):
    """With pipeline stages, ``tp-pp-dp`` puts a group's expert ranks ``tp x pp`` GPUs apart, on
    different servers; the default takes Megatron-LM's order, which keeps them on one NVLink."""
    dgx = load_system("dgx-h100-cluster:nodes=2")
    cfg, _ = _bind(dgx, MOE, text, order_given=False)
    assert cfg.order == "tp-dp-pp"
    groups = _domains(dgx, place(dgx, cfg), lambda dp, pp, tp: (dp // cfg.ep, pp, tp))
    assert len(groups) == cfg.gpus // cfg.ep and all(len(d) == 1 for d in groups.values())
    old = _domains(dgx, place(dgx, cfg.with_(order="tp-pp-dp")), lambda dp, pp, tp: (dp // cfg.ep, pp, tp))
    assert any(len(d) > 1 for d in old.values())


def test_expert_groups_move_the_order_only_where_they_would_leave_a_server():
    dgx = load_system("dgx-h100-cluster:nodes=2")
    for text in ("pp=2,dp=8,ep=2,global_batch=16",  # tp x pp x ep = 4: a group inside a server either way
                 "dp=16,ep=8,global_batch=16",  # no pipeline: the orders place ranks alike
                 "pp=2,dp=8,global_batch=16"):  # no experts split
        cfg, _ = _bind(dgx, MOE, text, order_given=False)
        assert cfg.order == "tp-pp-dp", text


def test_the_expert_parallel_default_is_faster_where_it_applies():
    """The estimate of the same configuration: Megatron-LM's order sends the all-to-alls over NVLink,
    the other order over the network adapters."""
    from marssim.plan import run as run_plan

    dgx = load_system("dgx-h100-cluster:nodes=2")
    cost = default_cost_model()
    text = "pp=2,dp=8,ep=8,global_batch=16"
    default, graph = _bind(dgx, MOE, text, order_given=False)
    named, _ = _bind(dgx, MOE, text + ",order=tp-pp-dp", order_given=True)
    fast = run_plan(default, graph, dgx, cost, how="estimate", memory_policy="ignore", detail=False).report
    slow = run_plan(named, graph, dgx, cost, how="estimate", memory_policy="ignore", detail=False).report
    assert fast.exposed_s["ep"] < slow.exposed_s["ep"] * 0.5 and fast.iteration_s < slow.iteration_s
