"""A parallel configuration's CLI report comes from the schedule's summaries unless a file or a
per-op report needs the per-task tables, and `simulate --estimate` estimates the simulation's
own lowering: every figure the same as the full run's and the estimate's own lowering's."""

from __future__ import annotations

import pytest

from marssim.cli import main
from marssim.cli._plan import needs_tables
from marssim.parallel import parse_parallel
from marssim.plan import bind_parallel, run
from marssim.system import load_system
from marssim.workload import load_workload

SYSTEM = "dgx-a100-cluster:nodes=1"
WORKLOAD = "gpt:layers=2,hidden=256,heads=4,vocab=1000,seq=64,mode=train,max_positions=64"
CONFIG = "tp=2,pp=2,dp=2,global_batch=4"


@pytest.fixture(scope="module")
def case():
    system = load_system(SYSTEM)
    plan, graph = bind_parallel(parse_parallel(CONFIG), load_workload(WORKLOAD), system, "--parallel",
                               micro_batch_given=False, batch_given=False)
    return plan, graph, system


def test_summary_run_reports_what_the_full_run_reports(case):
    plan, graph, system = case
    full = run(plan, graph, system, detail=True)
    brief = run(plan, graph, system, detail=False)
    assert full.result is not None and brief.result is None
    assert brief.report.to_dict() == full.report.to_dict()
    assert brief.makespan == full.makespan
    assert brief.report.lines() == full.report.lines()


@pytest.mark.parametrize("system_spec, config", [
    (SYSTEM, CONFIG),
    ("dgx-a100-cluster:nodes=2", "tp=1,pp=1,dp=16,zero=3,global_batch=16"),  # rings over several GPU classes
])
def test_estimate_of_the_simulation_lowering_is_the_estimate_lowering(system_spec, config):
    system = load_system(system_spec)
    plan, graph = bind_parallel(parse_parallel(config), load_workload(WORKLOAD), system, "--parallel",
                                micro_batch_given=False, batch_given=False)
    sim = run(plan, graph, system, detail=False)
    reused = run(plan, graph, system, how="estimate", memory_policy="ignore", detail=False, taskgraph=sim.taskgraph)
    own = run(plan, graph, system, how="estimate", memory_policy="ignore", detail=False)
    if config != CONFIG:  # the estimate's own lowering is the coupled one, with fewer tasks
        assert own.taskgraph.n_tasks < sim.taskgraph.n_tasks
    assert reused.makespan == own.makespan
    assert reused.report.to_dict() == own.report.to_dict()


def _printed(capsys, *extra):
    assert main(["simulate", "--system", SYSTEM, "--workload", WORKLOAD, "--parallel", CONFIG, *extra]) == 0
    return capsys.readouterr().out


def test_cli_report_is_the_same_with_and_without_the_tables(tmp_path, capsys):
    brief = _printed(capsys, "--estimate")
    full = _printed(capsys, "--estimate", "--out", str(tmp_path / "run"))  # --out keeps the per-task tables
    assert (tmp_path / "run" / "summary.json").exists()
    report = full.split("\n\nresult ")[0].rstrip("\n")
    assert brief.rstrip("\n") == report
    assert "analytical estimate: iteration" in brief


def test_tables_only_when_a_file_or_a_per_op_report_needs_them():
    import argparse

    def args(**given):
        base = dict(out=None, trace=None, intervals=None, plot=None, report=True, per_op=False, group=None)
        return argparse.Namespace(**{**base, **given})

    assert not needs_tables(args())
    for flag in ("out", "trace", "intervals", "plot"):
        assert needs_tables(args(**{flag: "x"}))
    assert needs_tables(args(per_op=True)) and needs_tables(args(group="stage"))
    assert not needs_tables(args(per_op=True, report=False))
