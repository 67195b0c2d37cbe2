"""Sums over a lowering's tasks read from its TaskProgram (its TaskGraph's columns never built)
are the sums over the columns, float for float: ``TaskProgram.row_sums`` (compiled and by runs
of ``np.bincount``) against ``np.add.at`` task after task, and the aggregations built on it
(compute seconds and energy per node, bytes per resource, the summary's throughput)."""

from __future__ import annotations

import numpy as np
import pytest

from marssim import taskprogram
from marssim.analytical import estimate
from marssim.cost import default_cost_model
from marssim.parallel import lower_parallel, parse_parallel
from marssim.results.aggregate import node_busy, node_compute_energy, resource_bytes
from marssim.results.summary import summarise
from marssim.system import load_system
from marssim.workload import load_workload

GPT = "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,max_positions=64,mode=train,batch=1"
CASES = [("dgx-a100-cluster:nodes=3", "tp=1,pp=1,dp=24,zero=3,micro_batch=1,global_batch=48,recompute=full"),
         ("dgx-a100-cluster:nodes=1", "tp=2,pp=2,dp=2,global_batch=8")]


def _lowered(case):
    system_spec, config = case
    system = load_system(system_spec)
    return lower_parallel(load_workload(GPT), system, parse_parallel(config), default_cost_model()), system


@pytest.mark.parametrize("case", CASES, ids=["zero3", "pipeline"])
@pytest.mark.parametrize("numba", [True, False], ids=["compiled", "bincount"])
def test_row_sums_add_task_after_task(case, numba, monkeypatch):
    if not numba:
        monkeypatch.setitem(taskprogram._KERNELS, "row_sums", None)
    tg, _ = _lowered(case)
    program = tg.program
    rows = len(program.rows["kind"])
    rng = np.random.default_rng(1)
    bins = rng.integers(-1, 7, rows)
    values = rng.random(rows) * 10.0 ** rng.integers(-8, 8, rows)  # magnitudes where the order shows
    row = program.rows_of(np.arange(tg.n_tasks))
    want = np.zeros(7)
    keep = bins[row] >= 0
    np.add.at(want, bins[row][keep], values[row][keep])
    got = program.row_sums(bins, values, 7)
    assert got.tolist() == want.tolist()
    shuffled = np.zeros(7)  # the same values in another order give other floats: the order is tested
    order = rng.permutation(int(keep.sum()))
    np.add.at(shuffled, bins[row][keep][order], values[row][keep][order])
    assert shuffled.tolist() != want.tolist()


@pytest.mark.parametrize("case", CASES, ids=["zero3", "pipeline"])
@pytest.mark.parametrize("numba", [True, False], ids=["compiled", "bincount"])
def test_aggregations_from_the_program_are_the_columns(case, numba, monkeypatch):
    if not numba:
        monkeypatch.setitem(taskprogram._KERNELS, "row_sums", None)
    tg, system = _lowered(case)
    est = estimate(tg, system)
    columns = ("kind", "device", "duration", "micro_batch", "route", "nbytes", "energy")

    def everything():
        energy, known = node_compute_energy(tg)
        return (summarise(tg, system, est.end), node_busy(tg).tolist(), resource_bytes(tg, system).tolist(),
                energy.tolist(), known.tolist())

    assert not any(c in tg.__dict__ for c in columns)
    from_program = everything()
    assert not any(c in tg.__dict__ for c in columns)  # read from the program alone
    for c in columns:
        getattr(tg, c)
    from_columns = everything()
    assert repr(from_program) == repr(from_columns)
    assert max(from_program[1]) > 0 and max(from_program[2]) > 0
    assert est.busy.tolist() == from_columns[1]  # the estimate's compute seconds per node are these
