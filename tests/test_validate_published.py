"""Predictions against published measurements: the shipped tables load and every row names a
configuration its system and workload can take; errors and their summary are what they say;
bad tables and flags that do not apply are refused on one line."""

from __future__ import annotations

import math

import pytest

from marssim.cli import main
from marssim.errors import InputError
from marssim.parallel import parse_parallel
from marssim.plan import bind_parallel
from marssim.system import load_system
from marssim.validate.published import (PublishedRun, format_predictions, load_published, predict, published_tables,
                                        summary)
from marssim.workload import load_workload

SMALL = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192,mode=train"


def test_the_shipped_tables_name_runs_their_systems_can_take():
    tables = published_tables()
    assert "korthikanti2022-table5" in tables
    for name in tables:
        runs = load_published(name)
        assert runs and all(r.measured_iteration_s > 0 and r.source for r in runs)
        for r in runs:
            system = load_system(r.system)
            cfg, graph = bind_parallel(parse_parallel(r.parallel), load_workload(r.workload), system, r.name,
                                       micro_batch_given=True, batch_given=False)
            assert cfg.gpus == len(system.accelerators) and graph.batch == cfg.micro_batch


def test_korthikanti_table5_pairs_each_model_with_and_without_recomputation():
    runs = load_published("korthikanti2022-table5")
    assert len(runs) == 8
    by_model = {}
    for r in runs:
        by_model.setdefault(r.workload, []).append(r)
    assert len(by_model) == 4
    for pair in by_model.values():
        full = next(r for r in pair if "recompute=full" in r.parallel)
        present = next(r for r in pair if "recompute=selective" in r.parallel and "sp=true" in r.parallel)
        assert present.measured_iteration_s < full.measured_iteration_s  # what the paper reports


def test_a_prediction_states_its_error_and_where_the_time_went():
    run = PublishedRun("small", "dgx-a100-cluster:nodes=1", SMALL, "tp=2,pp=2,dp=2,micro_batch=1,global_batch=8",
                       0.01, "a test")
    p = predict(run, how="estimate")
    assert not p.problem and p.iteration_s > 0
    assert p.error == pytest.approx(p.iteration_s / 0.01 - 1)
    assert p.busy_s + p.bubble_s + sum(p.exposed_s.values()) == pytest.approx(p.iteration_s, rel=1e-9)
    assert p.hfu >= p.mfu > 0
    other = PublishedRun("small2", run.system, run.workload, run.parallel, p.iteration_s * 2, "a test")
    q = predict(other, how="estimate")
    s = summary([p, q])
    assert s["rows"] == 2 and s["worst_abs"] == pytest.approx(max(abs(p.error), 0.5))
    assert s["mean_abs"] == pytest.approx((abs(p.error) + 0.5) / 2)
    text = format_predictions([p, q])
    assert all(len(line) <= 120 for line in text.splitlines()) and "-50.0%" in text


def test_a_run_that_cannot_be_predicted_says_why():
    bad = PublishedRun("bad", "dgx-a100-cluster:nodes=1", SMALL, "tp=3", 1.0, "a test")
    p = predict(bad, how="estimate")
    assert p.problem and math.isnan(p.iteration_s)
    assert summary([p])["rows"] == 0


def test_bad_tables_are_refused_naming_the_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,system,workload,parallel,measured_iteration_s,source\nx,ring-8,resnet50,tp=1,fast,me\n")
    with pytest.raises(InputError) as info:
        load_published(path)
    assert info.value.path == "row 1.measured_iteration_s"
    path.write_text("name,system\nx,ring-8\n")
    with pytest.raises(InputError, match="missing workload"):
        load_published(path)
    with pytest.raises(InputError, match="korthikanti2022-table5"):
        load_published("no-such-table")


def test_the_cli_predicts_a_table_and_refuses_flags_that_do_not_apply(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("# a test table\nname,system,workload,parallel,measured_iteration_s,source\n"
                    f'small,dgx-a100-cluster:nodes=1,"{SMALL}","tp=2,pp=2,dp=2,micro_batch=1,global_batch=8",0.01,me\n')
    assert main(["validate", "--published", str(path), "--how", "estimate", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "small" in out and "mean |error|" in out and (tmp_path / "o" / "published.csv").is_file()
    assert main(["validate", "--published", str(path), "--system", "ring-8"]) == 2
    assert "--system" in capsys.readouterr().err
