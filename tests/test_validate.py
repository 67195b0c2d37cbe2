"""``marssim validate``: sampling, per-mapping errors and statistics, contention attribution, user
estimates (and their input errors), the written report and the CLI verb."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import yaml
from scipy import stats

from marssim.analytical import estimate
from marssim.cli import main
from marssim.errors import InputError
from marssim.lower import lower
from marssim.mapping import AcceleratorSet, Mapping, save_mapping
from marssim.search import MappingSpace
from marssim.sim import simulate
from marssim.taskgraph import TaskGraphBuilder
from marssim.search.sample import FAMILIES, sample_mappings
from marssim.validate import NamedMapping, attribute, op_times, read_estimates, validate
from marssim.workload import GraphBuilder
from support import DESIGN, RooflineCost, make_system

COST = RooflineCost()


def _graph(batch: int = 8):
    b = GraphBuilder("tiny", batch=batch)
    x = b.input("img", c=8, h=16, w=16)
    x = b.conv("c1", x, 32, kernel=3)
    x = b.eltwise("r1", x, fn="relu")
    y = b.conv("c2", x, 32, kernel=3)
    x = b.eltwise("add", x, y, fn="add")
    x = b.conv("c3", x, 64, kernel=3, stride=2)
    x = b.global_pool("gap", x)
    b.linear("fc", x, 10)
    return b.build()


GRAPH = _graph()
SYSTEM = make_system(4, topology="ring", bandwidth="20 GB/s", host_bandwidth="8 GB/s")


@pytest.fixture(scope="module")
def sampled():
    # a seed whose sampled pipelines include host-fed ones (see test_pipelines_fed_from_one_host_link_blame_it)
    return sample_mappings(GRAPH, SYSTEM, 12, seed=4)


@pytest.fixture(scope="module")
def report(sampled):
    return validate(GRAPH, SYSTEM, sampled, COST, meta={"seed": 4})


# ---------------------------------------------------------------------- sampling
def test_sampling_is_deterministic_distinct_and_cycles_families(sampled):
    again = sample_mappings(GRAPH, SYSTEM, 12, seed=4)
    assert [m.mapping.key for m in sampled] == [m.mapping.key for m in again]
    assert len({m.mapping.key for m in sampled}) == 12
    assert [m.family for m in sampled] == [FAMILIES[i % 3] for i in range(12)]
    assert sample_mappings(GRAPH, SYSTEM, 12, seed=6)[0].mapping.key != sampled[0].mapping.key


def test_sampled_families_are_the_contended_kinds(sampled):
    space = MappingSpace(GRAPH, SYSTEM)
    for item in sampled:
        m = item.mapping
        if item.family == "pipeline":
            assert len(m.sets) >= 2 and m.micro_batches == max(space.micro_batch_choices)
        if item.family == "collective":
            for layer, opts in zip(space.layers, space.layer_strategies):
                pos = GRAPH.compute_ops.index(layer[0])
                # a layer on a one-device set runs whole there: the space writes it as "none"
                if {"oc", "ic"} & set(opts) and len(m.sets[m.op_set[pos]].devices) > 1:
                    assert m.op_sharding[pos] in ("oc", "ic")


# ---------------------------------------------------------------------- errors and statistics
def test_errors_and_statistics_match_an_independent_evaluation(report, sampled):
    rows = report.rows.set_index("mapping")
    for item in sampled[:4]:
        tg = lower(GRAPH, SYSTEM, item.mapping, COST)
        sim = simulate(tg, SYSTEM, record=False, setup=False).makespan
        est = estimate(tg, SYSTEM).makespan
        assert rows.loc[item.name, "simulated_s"] == sim
        assert rows.loc[item.name, "estimate_s"] == est
        assert rows.loc[item.name, "error"] == pytest.approx((est - sim) / sim, rel=1e-12)
    ok = report.rows[report.rows["feasible"]]
    err = ((ok["estimate_s"] - ok["simulated_s"]) / ok["simulated_s"]).abs().to_numpy()
    s = report.summary
    assert s["n"] == len(ok) == 12
    assert s["median_abs_error"] == pytest.approx(float(np.median(err)))
    assert s["p90_abs_error"] == pytest.approx(float(np.percentile(err, 90)))
    assert s["max_abs_error"] == pytest.approx(float(err.max()))
    assert s["kendall_tau"] == pytest.approx(stats.kendalltau(ok["estimate_s"], ok["simulated_s"]).statistic)
    assert s["spearman_rho"] == pytest.approx(stats.spearmanr(ok["estimate_s"], ok["simulated_s"]).statistic)
    assert s["lower_bound_holds"] and (ok["lower_bound_s"] <= ok["simulated_s"] * (1 + 1e-9)).all()
    assert (ok["wait_s"] >= -1e-12).all() and (ok["wait_estimate_s"] >= -1e-12).all()
    bounded = np.maximum(ok["estimate_s"], ok["lower_bound_s"])
    assert (ok["bounded_s"] == bounded).all()
    berr = ((bounded - ok["simulated_s"]) / ok["simulated_s"]).abs()
    assert s["bounded"]["median_abs_error"] == pytest.approx(float(np.median(berr)))
    # never further from the simulation than the contention-free estimate when that is below it
    below = ok["estimate_s"] <= ok["simulated_s"]
    assert (berr[below] <= ok["abs_error"][below] + 1e-15).all()


def test_contention_free_mapping_has_zero_error_and_nothing_to_attribute():
    # One device, one micro-batch: the input arrives, the ops run, the output leaves; no flow
    # ever shares a resource, so the estimate is the simulation.
    one = Mapping(sets=(AcceleratorSet(("acc2",), "os16"),), op_set=(0,) * len(GRAPH.compute_ops),
                  op_sharding=("none",) * len(GRAPH.compute_ops))
    rep = validate(GRAPH, SYSTEM, [NamedMapping("alone", one)], COST)
    row = rep.rows.iloc[0]
    assert abs(row["error"]) <= 1e-12
    assert row["explained_s"] == 0.0 and row["top_resources"] == ""
    assert row["wait_s"] == pytest.approx(row["wait_estimate_s"], rel=1e-12, abs=1e-18)
    assert rep.summary["exact"] == 1


def test_attribution_names_the_shared_link():
    # Four flows over one 10 GB/s link (with 1 TB/s memories): the extra time is the link's.
    system = make_system(2, topology="chain", bandwidth="10 GB/s", latency="0 s", memory_bandwidth="1 TB/s")
    b = TaskGraphBuilder(system)
    flows = [b.transfer("acc0", "acc1", 1e6) for _ in range(4)]
    b.compute("acc1", 1e-6, preds=tuple(flows))
    tg = b.build()
    est = estimate(tg, system)
    sim = simulate(tg, system, record=False, setup=False)
    log = sim.intervals.sort_values("task")
    delays, link_delay = attribute(tg, system, est, log["start"].to_numpy(), log["end"].to_numpy())
    assert list(delays) == ["acc0->acc1"]
    gap = sim.makespan - est.makespan
    assert delays["acc0->acc1"] == pytest.approx(gap, rel=1e-9)  # one flow on the path, 3 of its 4 units extra
    assert link_delay == pytest.approx(4 * (4e6 / 10e9) - 4 * (1e6 / 10e9), rel=1e-9)


def test_pipelines_fed_from_one_host_link_blame_it(report):
    # Every micro-batch's input crosses the 8 GB/s host link at once: the sampled pipelines'
    # gaps are charged to it first.
    top = report.rows[report.rows["family"] == "pipeline"]["top_resources"]
    assert sum(t.startswith("host0->acc0") for t in top) >= len(top) // 2
    assert report.attribution.iloc[0]["kind"] in ("link", "memory", "switch", "device")
    assert report.attribution["share"].sum() == pytest.approx(1.0)


def test_op_times_sum_each_micro_batch_span():
    system = make_system(2, topology="chain")
    b = TaskGraphBuilder(system)
    a0 = b.compute("acc0", 1e-5, op="x", micro_batch=0)
    b.compute("acc1", 3e-5, op="x", micro_batch=0)
    b.compute("acc0", 2e-5, op="x", micro_batch=1, preds=(a0,))
    b.compute("acc1", 5e-6, op="y", micro_batch=0)
    tg = b.build()
    est = estimate(tg, system)
    got = op_times(tg, est.start, est.end)
    # mb0 of x spans 0..3e-5 (acc1), mb1 runs 1e-5..3e-5 on acc0; y waits for x on acc1
    assert got["x"] == pytest.approx(3e-5 + 2e-5, rel=1e-12)
    assert got["y"] == pytest.approx(5e-6, rel=1e-12)


# ---------------------------------------------------------------------- user estimates
def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_user_estimates_per_mapping(tmp_path, sampled, report):
    rows = report.rows.set_index("mapping")
    lines = ["mapping,makespan_s"]
    for item in sampled[:6]:
        lines.append(f"{item.name},{float(2 * rows.loc[item.name, 'simulated_s'])!r}")
    lines.append(f"{sampled[6].mapping.key[:10]},{float(rows.loc[sampled[6].name, 'simulated_s'])!r}")  # by key prefix
    est = read_estimates(_write(tmp_path / "mine.csv", "\n".join(lines) + "\n"))
    rep = validate(GRAPH, SYSTEM, sampled[:8], COST, estimates=est)
    user = rep.rows.set_index("mapping")["user_error"]
    assert user[[m.name for m in sampled[:6]]].to_numpy() == pytest.approx([1.0] * 6)
    assert user[sampled[6].name] == pytest.approx(0.0, abs=1e-15)
    assert math.isnan(user[sampled[7].name])
    assert rep.summary["user"]["n"] == 7
    assert rep.summary["user"]["max_abs_error"] == pytest.approx(1.0)


def test_user_estimates_per_layer(tmp_path, sampled):
    tg = lower(GRAPH, SYSTEM, sampled[0].mapping, COST)
    log = simulate(tg, SYSTEM, record=False, setup=False).intervals.sort_values("task")
    sim_ops = op_times(tg, log["start"].to_numpy(), log["end"].to_numpy())
    text = "op,time_s,mapping\n" + "".join(f"{op},{float(1.5 * v)!r},{sampled[0].name}\n" for op, v in sim_ops.items())
    est = read_estimates(_write(tmp_path / "layers.csv", text))
    assert est.kind == "layer"
    rep = validate(GRAPH, SYSTEM, sampled[:2], COST, estimates=est)
    assert set(rep.layers["op"]) == set(sim_ops)
    assert (rep.layers["mapping"] == sampled[0].name).all()
    assert rep.layers["error"].to_numpy() == pytest.approx([0.5] * len(sim_ops))
    est = estimate(tg, SYSTEM)
    est_ops = op_times(tg, est.start, est.end)
    assert rep.layers.set_index("op")["estimate_s"].to_dict() == pytest.approx(est_ops)
    assert rep.summary["user"]["median_abs_error"] == pytest.approx(0.5)


@pytest.mark.parametrize("text,where,what", [
    ("name,seconds\nx,1\n", "header", "expected columns"),
    ("mapping,makespan_s\ns000-random,fast\n", "row 1.makespan_s", "expected a number of seconds, got 'fast'"),
    ("mapping,makespan_s\ns000-random,1e-3\ns001-pipeline,-2\n", "row 2.makespan_s", "non-negative"),
    ("mapping,makespan_s\ns000-random,1e-3\ns000-random,2e-3\n", "row 2.mapping", "appears twice"),
    ("mapping,makespan_s\n,1e-3\n", "row 1.mapping", "empty cell"),
    ("op,time_s\nc1,nan\n", "row 1.time_s", "non-negative"),
    ("mapping,makespan_s\n", "rows", "no estimates"),
])
def test_bad_estimates_files_name_file_row_and_column(tmp_path, text, where, what):
    path = _write(tmp_path / "bad.csv", text)
    with pytest.raises(InputError) as info:
        read_estimates(path)
    assert str(path) in str(info.value) and where in str(info.value) and what in str(info.value)


def test_estimates_for_unknown_mappings_or_ops_are_refused(tmp_path, sampled):
    est = read_estimates(_write(tmp_path / "m.csv", "mapping,makespan_s\ns000-random,1\nnope,2\n"))
    with pytest.raises(InputError, match=r"row 2\.mapping: unknown mapping 'nope'"):
        validate(GRAPH, SYSTEM, sampled[:2], COST, estimates=est)
    est = read_estimates(_write(tmp_path / "o.csv", "op,time_s\nc1,1\nconv9,2\n"))
    with pytest.raises(InputError, match=r"row 2\.op: unknown op 'conv9'"):
        validate(GRAPH, SYSTEM, sampled[:2], COST, estimates=est)


# ---------------------------------------------------------------------- files
def test_report_files_are_written_whole_and_reproducibly(tmp_path, report, sampled):
    paths = report.save(tmp_path / "a")
    names = sorted(p.name for p in paths)
    assert names == ["attribution.csv", "scatter.png", "scatter.svg", "summary.txt", "validate.csv"]
    assert (tmp_path / "a" / "scatter.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<svg" in (tmp_path / "a" / "scatter.svg").read_text()
    text = (tmp_path / "a" / "summary.txt").read_text()
    assert "Kendall tau" in text and "p90" in text
    again = validate(GRAPH, SYSTEM, sampled, COST, meta={"seed": 4})
    again.save(tmp_path / "b")
    for name in ("validate.csv", "summary.txt", "attribution.csv", "scatter.svg", "scatter.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name


def test_parallel_evaluation_gives_the_same_rows(sampled, report):
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=2) as pool:
        rep = validate(GRAPH, SYSTEM, sampled, COST, executor=pool)
    assert rep.rows.equals(report.rows)


# ---------------------------------------------------------------------- the CLI verb
def _system_file(tmp_path: Path) -> Path:
    data = {
        "name": "cli-ring", "designs": {"os16": DESIGN},
        "accelerators": [{"id": "acc[0-3]", "designs": ["os16"],
                          "memory": {"capacity": "4 GiB", "bandwidth": "1 TB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "64 GiB", "bandwidth": "100 GB/s"}}],
        "links": [{"pattern": "ring", "nodes": "acc[0-3]", "bandwidth": "20 GB/s", "latency": "1 us"},
                  {"between": ["host0", "acc0"], "bandwidth": "8 GB/s", "latency": "1 us"}],
    }
    path = tmp_path / "cli-ring.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.fixture
def cli_env(tmp_path, monkeypatch):
    import marssim.cost

    monkeypatch.setattr(marssim.cost, "default_cost_model", lambda **_: RooflineCost(), raising=False)
    return _system_file(tmp_path)


WORKLOAD = "mobilenetv2:batch=2,image=32"


def test_cli_samples_and_writes_the_report(tmp_path, cli_env, capsys):
    out = tmp_path / "out"
    code = main(["validate", "--system", str(cli_env), "--workload", WORKLOAD, "--sample", "3", "--seed", "1",
                 "--out", str(out)])
    text = capsys.readouterr().out
    assert code == 0
    assert "3 mappings (sampled, seed 1)" in text and "Kendall tau" in text
    frame = (out / "validate.csv").read_text().splitlines()
    assert frame[0].startswith("mapping,key,family") and len(frame) == 4
    assert (out / "scatter.png").is_file() and (out / "scatter.svg").is_file()


def test_cli_reads_a_mapping_directory_and_user_estimates(tmp_path, cli_env, capsys):
    from marssim.system import load_system
    from marssim.workload import load_workload

    system = load_system(str(cli_env))
    graph = load_workload(WORKLOAD)
    mdir = tmp_path / "maps"
    mdir.mkdir()
    save_mapping(Mapping.single_set(graph, system, sharding="dp"), graph, mdir / "dp.yaml")
    save_mapping(Mapping.single_set(graph, system, devices=("acc1",), sharding="none"), graph, mdir / "one.yaml")
    est = _write(tmp_path / "mine.csv", "mapping,makespan_s\ndp,1e-3\none,2e-3\n")
    code = main(["validate", "--system", str(cli_env), "--workload", WORKLOAD, "--mappings", str(mdir),
                 "--estimates", str(est), "--out", str(tmp_path / "out")])
    text = capsys.readouterr().out
    assert code == 0
    assert "user estimates (per mapping)" in text
    rows = (tmp_path / "out" / "validate.csv").read_text().splitlines()
    assert rows[1].startswith("dp,") and rows[2].startswith("one,") and "user_error" in rows[0]


def test_cli_bad_estimates_file_is_one_line_and_no_output(tmp_path, cli_env, capsys):
    est = _write(tmp_path / "bad.csv", "mapping,makespan_s\ns000-random,soon\n")
    out = tmp_path / "out"
    code = main(["validate", "--system", str(cli_env), "--workload", WORKLOAD, "--sample", "2",
                 "--estimates", str(est), "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1 and "bad.csv: row 1.makespan_s" in err
    assert not out.exists()


def test_cli_missing_mapping_directory(tmp_path, cli_env, capsys):
    code = main(["validate", "--system", str(cli_env), "--workload", WORKLOAD, "--mappings",
                 str(tmp_path / "none"), "--out", str(tmp_path / "out")])
    assert code == 2 and "expected a directory" in capsys.readouterr().err


def test_device_wait_counts_time_ready_but_queued():
    from marssim.validate.compare import _device_wait

    system = make_system(1, topology="chain")
    b = TaskGraphBuilder(system)
    for k, d in enumerate((1e-6, 2e-6, 3e-6)):
        b.compute("acc0", d, priority=k)
    tg = b.build()
    log = simulate(tg, system, record=False, setup=False).intervals.sort_values("task")
    # all three ready at 0; they start at 0, 1 and 3 us
    assert _device_wait(tg, log["start"].to_numpy(), log["end"].to_numpy()) == pytest.approx(4e-6, rel=1e-12)
