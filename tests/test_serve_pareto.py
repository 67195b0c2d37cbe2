"""Pareto fronts of the serving search and the top list's sources: the front is exactly the
non-dominated set (against a pairwise dominance check), a screen-only deployment never appears on
it nor counts as meeting the constraints, simulated deployments meeting them come first in the
top list, and the GA simulates the screen's front within its budget (so every point is a
simulation) and the CLI writes the table and the figure."""

from __future__ import annotations

import math
import random

import pandas as pd
import pytest

from support import RooflineCost, make_system

from marssim.search.evaluate import DeploymentEvaluation
from marssim.search.pareto import (FRONTS, dominates, front_points, front_table, non_dominated, plot_fronts,
                                   screen_front)
from marssim.search.report import format_top, top_candidates, top_rows
from marssim.search.result import Candidate, SearchResult
from marssim.serve import Arrivals, Deployment, Lengths, Pool, RequestSpec, SchedulerConfig, load_model
from marssim.serve.case import ServeCase
from marssim.serve.slo import parse_constraints

from test_serve_search_cli import case as cli_case, system  # noqa: F401  (the CLI tests' system fixture)


def brute_front(values: list[tuple[float, ...]], senses) -> list[int]:
    """The non-dominated indices by the definition, every pair compared, written out here."""
    def better_or_equal(a, b, s):
        return a >= b if s == "max" else a <= b

    out = []
    for i, v in enumerate(values):
        dominated = False
        for j, w in enumerate(values):
            if j != i and all(better_or_equal(a, b, s) for a, b, s in zip(w, v, senses)) and w != v:
                dominated = True
                break
        if not dominated:
            out.append(i)
    return out


@pytest.mark.parametrize("senses", [("max", "max"), ("min", "max"), ("min", "min"), ("max", "min", "max")])
@pytest.mark.parametrize("seed", range(6))
def test_the_front_is_exactly_the_non_dominated_set(senses, seed):
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    # a coarse grid forces ties on one figure and duplicate points
    values = [tuple(float(rng.randint(0, 9)) for _ in senses) for _ in range(n)]
    got = non_dominated(values, lambda v: v, senses)
    assert got == brute_front(values, senses)
    front = [values[i] for i in got]
    for i, v in enumerate(values):
        if i not in got:  # every point off the front is dominated by one on it
            assert any(dominates(f, v, senses) for f in front)
    for a in front:  # no point on it dominates another
        assert not any(dominates(b, a, senses) for b in front)


def test_a_known_front():
    # (tokens/s per user, tokens/s per GPU): (1, 9) (2, 7) (5, 5) on it; (2, 6), (1, 5), (4, 4) dominated
    values = [(1, 9), (2, 6), (2, 7), (5, 5), (1, 5), (4, 4)]
    assert non_dominated(values, lambda v: v, ("max", "max")) == [0, 2, 3]
    # GPUs (fewer) against rate (higher): 8 GPUs at 10 req/s beats 12 at 9; 16 at 20 is on it
    assert non_dominated([(8, 10.0), (12, 9.0), (16, 20.0)], lambda v: v, ("min", "max")) == [0, 2]


# ----------------------------------------------------------------------------- candidates
def dep(replicas: int, tp: int = 1) -> Deployment:
    return Deployment((Pool(replicas, tp, 1, "both", "", SchedulerConfig()),))


def figures(gpus: int, tokens: float, per_user: float, ttft: float, ratio: float) -> DeploymentEvaluation:
    return DeploymentEvaluation(1.0, tokens, rate=10.0, goodput=10.0, gpus=gpus, slo_ratio=ratio,
                                user_tokens_per_s=per_user,
                                latency={"ttft_p99": ttft, "tbt_p99": 0.05, "tpot_p99": 0.04,
                                         "tpot_mean": 1.0 / per_user, "e2e_mean": 2.0})


def search_result(candidates: list[Candidate], best: Candidate) -> SearchResult:
    return SearchResult("mars", "gpus", best.plan, best.simulated, pd.DataFrame(), 0, 0, 0.0,
                        candidates=candidates)


@pytest.fixture
def misleading():
    """The case of a screen that flatters: 16 GPUs simulated and meeting the constraints; 8 and 12
    GPUs screened at TTFT P99 1.03 s, never simulated (simulated, 8 GPUs would take 20.6 s); one
    simulated deployment that misses them."""
    met16 = Candidate(dep(16), screened=figures(16, 4000, 40, 0.9, 0.8), simulated=figures(16, 4100, 41, 1.2, 0.9))
    met32 = Candidate(dep(16, 2), simulated=figures(32, 6000, 60, 0.5, 0.4))
    screen8 = Candidate(dep(8), screened=figures(8, 9000, 90, 1.03, 0.6))
    screen12 = Candidate(dep(12), screened=figures(12, 9500, 95, 1.03, 0.6))
    missed = Candidate(dep(4), screened=figures(4, 9900, 99, 1.0, 0.5), simulated=figures(4, 2000, 5, 20.6, 10.0))
    return [screen8, met16, screen12, missed, met32], met16


def test_screen_only_rows_are_never_presented_as_meeting_the_constraints(misleading):
    cands, best = misleading
    result = search_result(cands, best)
    top = top_candidates(result)
    assert [c.plan.gpus for c in top][:2] == [16, 32]  # simulated and meeting them first, by fitness
    assert all(c.simulated is not None for c in top[:2]) and all(c.simulated is None for c in top[2:])
    rows = top_rows(result)
    for c, row in zip(top, rows):
        assert row["source"] == ("simulated" if c.simulated is not None else "screen only")
        assert row["meets_slo"] == (c.simulated is not None and c.simulated.slo_ratio <= 1)
    assert not any(r["meets_slo"] for r in rows if r["gpus"] in (8, 12))
    lines = format_top(result).splitlines()
    eight = next(line for line in lines if line.split()[1:2] == ["8xtp1"])
    sixteen = next(line for line in lines if line.split()[1:2] == ["16xtp1"])
    assert eight.split()[3:5] == ["screen", "?"] and "met" not in eight.split()
    assert sixteen.split()[3:5] == ["sim", "met"]
    assert lines.index(sixteen) < lines.index(eight)
    assert max(len(line) for line in lines) <= 120


def test_the_front_holds_simulations_meeting_the_constraints_only(misleading):
    cands, _ = misleading
    points = front_points(cands, "gpus")
    # the screened 8 and 12 GPUs would dominate everything; the 4-GPU deployment missed them
    assert sorted(p.gpus for p in points) == [16, 32]
    table = front_table(points)
    assert set(table["source"]) == {"simulated"}
    for name, ((xa, xs), (ya, ys)) in FRONTS.items():
        values = list(zip(table[xa], table[ya]))
        assert sorted(i for i, on in enumerate(table[f"on_{name}_front"]) if on) == brute_front(values, (xs, ys))


@pytest.mark.parametrize("seed", range(3))
def test_the_table_of_random_deployments_marks_exactly_the_front(seed):
    rng = random.Random(seed)
    cands = []
    for i in range(40):
        e = figures(rng.choice((2, 4, 8, 16)), rng.uniform(1e3, 1e4), rng.uniform(10, 100), 0.5,
                    rng.choice((0.5, 0.9, 1.5)))
        simulated = rng.random() < 0.7
        cands.append(Candidate(dep(i + 1), screened=None if simulated else e, simulated=e if simulated else None))
    table = front_table(front_points(cands, "gpus"))
    meeting = [c for c in cands if c.simulated is not None and c.simulated.slo_ratio <= 1]
    assert sorted(table["deployment"]) == sorted(c.plan.text() for c in meeting)
    for name, ((xa, xs), (ya, ys)) in FRONTS.items():
        values = list(zip(table[xa], table[ya]))
        on = {i for i, flag in enumerate(table[f"on_{name}_front"]) if flag}
        assert sorted(on) == brute_front(values, (xs, ys))
        for i in set(range(len(values))) - on:  # a dominated point is off the front
            assert any(dominates(values[j], values[i], (xs, ys)) for j in on)
    per_gpu = [c.simulated.throughput / c.simulated.gpus for c in meeting]
    assert sorted(table["output_tokens_per_s_per_gpu"]) == pytest.approx(sorted(per_gpu))


def test_the_figure_is_written(misleading, tmp_path):
    cands, _ = misleading
    paths = plot_fronts(front_table(front_points(cands, "gpus")), tmp_path / "pareto.png", "a title")
    assert [p.name for p in paths] == ["pareto.png", "pareto.svg"]
    assert all(p.stat().st_size > 1000 for p in paths)
    svg = paths[1].read_text()
    assert "16xtp1" in svg and "8xtp1" not in svg  # annotated with the deployments; no screen-only point


# ----------------------------------------------------------------------------- the GA
MODEL = "llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=768,vocab=2000"


@pytest.mark.parametrize("budget", [8, 20])
def test_the_ga_simulates_the_screens_front_within_its_budget(budget):
    from marssim.search.serve import ServeSearchSettings, mars_serve

    model = load_model(MODEL)
    octo = make_system(8, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")
    spec = RequestSpec(Arrivals("poisson", rate=400.0), Lengths("uniform", low=20, high=600),
                       Lengths("uniform", low=2, high=120), 150)
    case = ServeCase(model, spec, 0, parse_constraints("ttft_p99=15ms,tbt_p99=3ms"), (), goodput=False)
    settings = ServeSearchSettings(objective="gpus", generations=2, max_simulations=budget, population=4, max_pp=1,
                                   max_num_seqs=(64, 256), max_batched_tokens=(512, 2048), block_sizes=(16,))
    assert settings.front_reserve == min(6, budget // 4)
    result = mars_serve(case, octo, RooflineCost(), settings)
    note = result.notes["pareto"]
    assert result.simulations <= settings.max_simulations
    screened = [(c.plan, c.screened) for c in result.candidates if c.screened is not None]
    front = screen_front(screened, settings.screen_slack)
    assert note["screen_front"] == len(front) > 0
    unsimulated = [d for d in front if not any(c.plan == d and c.simulated is not None for c in result.candidates)]
    assert len(unsimulated) == note["left_by_budget"]
    if unsimulated:  # only the budget leaves a deployment of the screen's front unsimulated, and the
        # generations left the front its reserve (less the GA's own last pick)
        assert result.simulations == settings.max_simulations
        assert note["simulated_for_front"] >= settings.front_reserve - 1
    simulated = {c.plan.text() for c in result.candidates if c.simulated is not None}
    table = front_table(front_points(result.candidates, "gpus"))
    assert len(table) and set(table["deployment"]) <= simulated


def test_search_prints_and_writes_the_front(system, tmp_path, capsys):  # noqa: F811
    from marssim.cli import main

    out = tmp_path / "plan"
    assert main(["search", *cli_case(system, "--objective", "gpus", "--budget", "6", "--generations", "2",
                                     "--population", "4", "--out", str(out))]) == 0
    text = capsys.readouterr().out
    assert "Pareto front" in text
    table = pd.read_csv(out / "pareto.csv")
    assert len(table) and set(table["source"]) == {"simulated"}
    assert table["on_tokens_front"].any()
    assert (out / "pareto.png").stat().st_size > 1000
    top = pd.read_csv(out / "top10.csv")
    assert not top.loc[top["source"] == "screen only", "meets_slo"].any()
    assert math.isfinite(table["output_tokens_per_s_per_gpu"].max())


def test_compare_writes_the_front_of_every_search_beside_its_table(system, tmp_path, capsys):  # noqa: F811
    from marssim.cli import main

    csv = tmp_path / "table.csv"
    assert main(["compare", *cli_case(system, "--objective", "gpus", "--budget", "4", "--generations", "1",
                                      "--population", "4", "--exhaustive-limit", "0", "--csv", str(csv))]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert any(line.startswith("Pareto front") for line in lines)
    assert max(len(line) for line in lines[1:]) <= 120
    front = pd.read_csv(tmp_path / "table-pareto.csv")
    assert len(front) and set(front["source"]) == {"simulated"}
    assert (tmp_path / "table-pareto.png").exists() and (tmp_path / "table-pareto.svg").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["table-pareto.csv", "table-pareto.png",
                                                         "table-pareto.svg", "table.csv"]  # nothing left over
    # every point is a deployment meeting the constraints: its GPUs no fewer than the fewest found
    table = pd.read_csv(csv)
    assert front["gpus"].min() == table["gpus"].min()
