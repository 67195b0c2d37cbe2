"""The expert-parallel all-to-all as the estimate and the simulation time it: a rank sends its
routed tokens to its ``ep - 1`` peers at once, so those flows share the rank's NVLink port (and
each receiver's), and the dispatch of ``S`` bytes per rank takes ``(ep - 1) S / (ep B)``. The
simulation gives that by contention; the estimate, which otherwise times each flow alone, by
loading each resource with the flows of the collective that cross it
(:func:`marssim.analytical.estimate.direct_rates`). Timed alone, each flow took ``1 / (ep - 1)``
of it, and a fine-grained mixture of experts (Qwen3-30B-A3B, 128 experts, 8 routed per token)
came out 22% faster by the estimate than by the simulation.

The backward reads the experts' output in the tokens' layout, as the forward's combine made it:
autograd keeps that tensor, so no second all-to-all brings it back (each expert layer's output
crosses the expert-parallel group once per micro-batch and direction)."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.analytical import estimate
from marssim.cost import default_cost_model
from marssim.parallel import lower_parallel, parse_parallel
from marssim.sim import simulate
from marssim.system import load_system
from marssim.taskgraph import COMPUTE
from marssim.workload import load_workload

SPEC = ("qwen3-30b-a3b:layers=2,seq=2048,batch=2,mode=train,dtype=fp8,fp8_recipe=mxfp8,fp8_param_gather=true,"
        "attention=flash,cross_entropy=fused")
CONFIG = "tp=1,pp=1,dp=8,ep=8,micro_batch=2,global_batch=32,zero=1,grad_reduce_dtype=bf16"


@pytest.fixture(scope="module")
def runs():
    system = load_system("dgx-b200-cluster:nodes=1")
    tg = lower_parallel(load_workload(SPEC), system, parse_parallel(CONFIG), default_cost_model(), folding=False)
    return system, tg, estimate(tg, system), simulate(tg, system)


def _all_to_all(tg) -> np.ndarray:
    kinds = np.array([c.kind for c in tg.collectives] + [""])
    return np.flatnonzero((tg.kind != COMPUTE) & (kinds[tg.collective] == "all_to_all") & (tg.collective >= 0))


def test_each_dispatch_flow_takes_its_share_of_the_rank_s_port(runs) -> None:
    system, tg, est, sim = runs
    flows = _all_to_all(tg)
    assert len(flows)
    nvlink = 900e9  # a B200's NVLink bandwidth per direction (dgx-b200-cluster.yaml)
    for t in flows:
        route = tg.routes[tg.route[t]]
        # the flows leaving this rank with it: one to each of the 7 peers
        same = flows[(tg.op[flows] == tg.op[t]) & (tg.micro_batch[flows] == tg.micro_batch[t])
                     & (tg.src[flows] == tg.src[t])]
        assert len(same) == 7
        expected = route.latency + len(same) * tg.nbytes[t] / nvlink
        assert est.duration[t] == pytest.approx(expected, rel=1e-9)


def test_the_estimate_of_a_moe_step_follows_the_simulation(runs) -> None:
    system, tg, est, sim = runs
    # forward: dispatch and combine; backward: their gradients -- four all-to-alls per expert
    # layer and micro-batch, each of 7 flows per rank
    flows = _all_to_all(tg)
    per = {(int(tg.op[f]), int(tg.micro_batch[f]), int(tg.src[f])) for f in flows}
    assert len(flows) == 7 * len(per) and len(per) == 4 * 2 * 2 * 8  # 2 layers, 2 micro-batches, 8 GPUs
    log = sim.intervals.set_index("task").sort_index()
    flows = _all_to_all(tg)
    took = (log["end"] - log["start"]).reindex(flows).to_numpy()
    # the simulated flows take the estimate's shared time where nothing else crosses the port
    assert np.median(took / est.duration[flows]) == pytest.approx(1.0, rel=0.02)
    assert est.makespan == pytest.approx(sim.makespan, rel=0.05)
