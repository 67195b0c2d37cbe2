"""The report's attribution of idle time: the predecessor each task waited for last, found by
vectorised segment reductions, is the one a plain scan over its predecessor list picks (the
latest end, the lowest index among equal ends), on a simulated ZeRO-3 run and on a pipeline;
and the volumes per GPU and group are the sums a loop over the transfers gives."""

from __future__ import annotations

import numpy as np
import pytest

from marssim.cost import default_cost_model
from marssim.parallel import lower_parallel, parse_parallel
from marssim.parallel.report import _volumes, latest_predecessors
from marssim.sim import simulate_schedule
from marssim.system import load_system
from marssim.taskgraph import COMPUTE
from marssim.workload import load_workload

GPT = "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,max_positions=64,mode=train,batch=1"
CASES = [("dgx-a100-cluster:nodes=3", "tp=1,pp=1,dp=24,zero=3,micro_batch=1,global_batch=48,recompute=full"),
         ("dgx-a100-cluster:nodes=1", "tp=2,pp=2,dp=2,global_batch=8")]


@pytest.fixture(scope="module", params=CASES, ids=["zero3", "pipeline"])
def run(request):
    system_spec, config = request.param
    system = load_system(system_spec)
    tg = lower_parallel(load_workload(GPT), system, parse_parallel(config), default_cost_model())
    return tg, simulate_schedule(tg, system, memory_policy="ignore")


@pytest.mark.parametrize("chunk", [1 << 20, 1000])
def test_latest_predecessor_is_the_scans_choice(run, chunk, monkeypatch):
    import marssim.parallel.report as report

    monkeypatch.setattr(report, "_CHUNK_EDGES", chunk)  # in one piece, and in pieces of tasks
    tg, schedule = run
    end = schedule.end.copy()
    end[::7] = np.round(end[::7], 4)  # equal ends, so that the tie rule is exercised
    got = latest_predecessors(tg, end)
    pp, pi = tg.pred_ptr, tg.pred_idx
    ties = 0
    for t in range(len(pp) - 1):
        preds = [int(p) for p in pi[pp[t]:pp[t + 1]]]
        want = max(preds, key=lambda q: (end[q], -q)) if preds else -1
        ties += len({float(end[q]) for q in preds}) < len(preds)
        assert got[t] == want, t
    assert ties > 0


def test_volumes_are_the_loops_sums(run):
    tg, _ = run
    reps = {int(d) for d in np.unique(tg.device[tg.kind == COMPUTE])[:3]}
    want: dict[int, dict[str, float]] = {}
    transfer = np.flatnonzero(tg.kind != COMPUTE)
    names = [c.group or "pp" for c in tg.collectives] + ["pp"]
    for t in transfer.tolist():
        src, dst = int(tg.src[t]), int(tg.dst[t])
        owner = src if src in reps else dst
        row = want.setdefault(owner, {})
        g = names[int(tg.collective[t])]
        row[g] = row.get(g, 0.0) + float(tg.nbytes[t])
    got = _volumes(tg, reps)
    assert got == want
    assert list(got) == list(want) and all(list(got[k]) == list(want[k]) for k in want)


def test_latest_predecessor_of_chosen_tasks_with_one_left_out(run):
    tg, schedule = run
    end = schedule.end.copy()
    end[::5] = np.round(end[::5], 4)
    pp, pi = tg.pred_ptr, tg.pred_idx
    rng = np.random.default_rng(0)
    tasks = rng.choice(len(pp) - 1, size=min(400, len(pp) - 1), replace=False)
    # leave out a predecessor of most tasks (the only one of some), none of the others
    excluded = np.array([int(pi[pp[t]]) if pp[t + 1] > pp[t] and i % 4 else -1 for i, t in enumerate(tasks)])
    got = latest_predecessors(tg, end, tasks, excluded)
    for t, x, g in zip(tasks.tolist(), excluded.tolist(), got.tolist()):
        preds = [int(p) for p in pi[pp[t]:pp[t + 1]] if int(p) != x]
        assert g == (max(preds, key=lambda q: (end[q], -q)) if preds else -1), t
