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
    from marssim.parallel import report

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


def _python_walk(tg, start, end, device, makespan, latest):
    """The attribution as a loop over each gap's predecessors, step by step in Python: what the
    compiled walk (marssim.parallel.gapwalk) must give, float for float."""
    out = dict.fromkeys(("tp", "cp", "sp", "pp", "dp", "ep", "emb", "mp", "bubble"), 0.0)
    comp = np.flatnonzero((tg.kind == COMPUTE) & (tg.device == device))
    comp = comp[np.lexsort((comp, start[comp]))]
    gaps_end = start[comp]
    gaps_start = np.concatenate([[0.0], end[comp[:-1]]])
    gaps = np.flatnonzero(gaps_end - gaps_start > 1e-15)
    firsts = latest_predecessors(tg, end, comp[gaps], np.where(gaps > 0, comp[np.maximum(gaps - 1, 0)], -1))
    for k, p in zip(gaps.tolist(), firsts.tolist()):
        lo, cursor, guard = float(gaps_start[k]), float(gaps_end[k]), 0
        while cursor > lo + 1e-15 and guard < 10_000:
            guard += 1
            if p < 0:
                out["bubble"] += cursor - lo
                break
            e = float(end[p])
            if e < cursor - 1e-15:
                out["bubble"] += cursor - max(lo, e)
                cursor = max(lo, e)
                if cursor <= lo + 1e-15:
                    break
            if tg.kind[p] == COMPUTE:
                out["bubble"] += cursor - lo
                break
            seg_start = max(lo, float(start[p]))
            c = tg.collective[p]
            out[(tg.collectives[c].group if c >= 0 else "") or "pp"] += cursor - seg_start
            cursor = seg_start
            p = int(latest[p])
    out["bubble"] += max(0.0, makespan - float(end[comp[-1]]))
    return out


@pytest.mark.parametrize("numba", [True, False], ids=["compiled", "python"])
def test_attribution_is_the_python_walks(run, numba, monkeypatch):
    from marssim.parallel import gapwalk
    from marssim.parallel.report import _attribute, compute_by_device

    if not numba:  # the walk in plain Python (and the predecessors from the TaskGraph's lists)
        monkeypatch.setattr(gapwalk, "_COMPILED", {"walk": gapwalk._walk})
    tg, schedule = run
    start, end = schedule.start, schedule.end
    makespan = float(np.nanmax(end))
    latest = latest_predecessors(tg, end)
    by_device = compute_by_device(tg)
    charged = 0
    for d in np.unique(tg.device[tg.kind == COMPUTE]).tolist():
        assert np.array_equal(by_device[d], np.flatnonzero((tg.kind == COMPUTE) & (tg.device == d)))
        want = _python_walk(tg, start, end, d, makespan, latest)
        got = _attribute(tg, start, end, d, makespan, latest, by_device[d])
        assert got == want, d  # the same floats, bit for bit
        charged += sum(v > 0 for k, v in want.items() if k != "bubble")
    assert charged > 0  # some waits are charged to a collective, not all to the bubble


def test_program_and_lists_agree_on_chosen_tasks(run, monkeypatch):
    """The predecessors read from the lowering's program (compiled) and from the TaskGraph's
    lists (vectorised) pick the same task, with one predecessor of each task left out."""
    from marssim.parallel import gapwalk

    tg, schedule = run
    end = np.round(schedule.end, 4)  # equal ends: the tie rule
    tasks = np.arange(0, tg.n_tasks, 3)
    pp, pi = tg.pred_ptr, tg.pred_idx
    excluded = np.where(pp[tasks + 1] > pp[tasks], pi[np.minimum(pp[tasks], len(pi) - 1)], -1)
    assert gapwalk.compiled()
    got = latest_predecessors(tg, end, tasks, excluded)
    monkeypatch.setattr(gapwalk, "_COMPILED", {"walk": gapwalk._walk})
    want = latest_predecessors(tg, end, tasks, excluded)
    assert np.array_equal(got, want)
    assert (got == -1).any() and (got >= 0).any()


@pytest.mark.parametrize("case", CASES, ids=["zero3", "pipeline"])
@pytest.mark.parametrize("numba", [True, False], ids=["compiled", "python"])
def test_report_from_the_program_is_the_columns(case, numba, monkeypatch):
    """A report read from a lowering's program (its TaskGraph's columns never built: the
    compute tasks per GPU, their FLOPs, the walk's kinds, categories and latest predecessors by
    row, the volumes by row) is the report read from the columns, float for float and key for
    key."""
    import json

    from marssim import taskprogram
    from marssim.analytical import estimate
    from marssim.parallel import gapwalk
    from marssim.parallel.report import report_of

    system_spec, config = case
    system = load_system(system_spec)
    tg = lower_parallel(load_workload(GPT), system, parse_parallel(config), default_cost_model())
    est = estimate(tg, system)
    if not numba:  # the row sums by np.bincount over runs of instances, the walk in Python over per-task columns
        monkeypatch.setitem(taskprogram._KERNELS, "row_sums", None)
        monkeypatch.setattr(gapwalk, "_COMPILED", {"walk": gapwalk._walk})
    assert "kind" not in tg.__dict__
    from_program = report_of(tg, system, est).to_dict()
    assert "kind" not in tg.__dict__  # read from the program alone
    tasks, rows = tg.program.tasks_of_rows(tg.program.rows["kind"] == COMPUTE)
    assert np.array_equal(tasks, np.flatnonzero(tg.kind == COMPUTE))
    assert np.array_equal(rows, tg.program.rows_of(tasks))
    from_columns = report_of(tg, system, est).to_dict()
    assert json.dumps(from_program) == json.dumps(from_columns)  # the same floats, in the same order
    assert any(v.get("dp_bytes", 0) > 0 or v.get("pp_bytes", 0) > 0 for v in from_program["per_gpu"].values())
