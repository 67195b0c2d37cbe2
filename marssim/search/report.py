"""How a search's outcome reads, whatever its plans: the fitness in a person's units, the best
plan, the top candidates as a table that fits 120 columns, the convergence figure, and the
summary that ``marssim search --out`` writes as ``search.json`` (the files themselves are
written by the command)."""

from __future__ import annotations

import math
import numbers
from pathlib import Path

from marssim.parallel import ParallelConfig
from marssim.plan import plan_key
from marssim.plan.kinds import KINDS, PlanKind, kind_of, short_config, short_deployment
from marssim.serve.deployment import Deployment
from marssim.system import System
from marssim.workload import Graph

from .result import Candidate, SearchResult

__all__ = ["fitness_display", "plot_convergence", "save_figure", "describe_best", "describe_mapping", "format_top",
           "top_candidates", "top_rows", "equivalence_key", "deployment_source", "meets_slo", "search_summary",
           "short_config", "short_deployment", "describe_deployment", "deployment_class", "WIDTH"]

WIDTH = 120
"""Columns the printed tables fit in."""


def fitness_display(objective: str, fitness: float, serving: bool = False) -> tuple[str, float]:
    """A fitness (the value minimised) as a person reads it: ``(label with unit, value)``."""
    if objective == "goodput":
        return "goodput (requests/s)", 1.0 / fitness if fitness > 0 and math.isfinite(fitness) else 0.0
    if objective == "gpus":
        return "GPUs", float(math.floor(fitness)) if math.isfinite(fitness) else math.inf
    if objective == "cost":
        return "$ per million output tokens", fitness
    if objective == "latency":
        return ("time per output token (ms)" if serving else "makespan (ms)"), fitness * 1e3
    if objective == "throughput":
        return ("output tokens/s" if serving else "throughput (samples/s)"), \
            1.0 / fitness if fitness > 0 and math.isfinite(fitness) else 0.0
    if objective == "energy":
        return "energy (mJ)", fitness * 1e3
    if objective == "edp":
        return "energy-delay product (mJ*ms)", fitness * 1e6
    raise ValueError(f"unknown objective {objective!r}")


def _serving(result: SearchResult) -> bool:
    """Whether the result's figures are a serving LLM's (latency per output token)."""
    e = result.evaluation
    return e.kind is PlanKind.PARALLEL and e.serving


def plot_convergence(results: SearchResult | list[SearchResult], png: str | Path) -> list[Path]:
    """Best fitness so far against simulations run, one line per search (a one-generation search,
    such as a baseline grid, as a horizontal line; the population mean dashed for a single
    search); PNG and SVG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    results = [results] if isinstance(results, SearchResult) else list(results)
    first = results[0]
    label, _ = fitness_display(first.objective, 1.0, _serving(first))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    for res in results:
        hist = res.history
        best = [fitness_display(res.objective, f, _serving(res))[1] for f in hist["best_fitness"]]
        if len(hist) == 1 and len(results) > 1:
            ax.axhline(best[0], ls="--", color="grey", label=f"{res.algorithm} (best simulated)")
            continue
        ax.step(hist["simulations"], best, where="post", marker="o", label=f"{res.algorithm}: best so far")
        if len(results) == 1 and "mean_fitness" in hist:
            mean = [fitness_display(res.objective, f, _serving(res))[1] if math.isfinite(f) else float("nan")
                    for f in hist["mean_fitness"]]
            ax.plot(hist["simulations"], mean, ls="--", color="grey", label="population mean")
    ax.set_xlabel("simulations")
    ax.set_ylabel(label)
    ax.set_title(f"{' vs '.join(r.algorithm for r in results)} convergence (seed {first.seed})")
    ax.grid(alpha=0.3)
    ax.legend()
    return save_figure(fig, png)


def save_figure(fig, png: str | Path) -> list[Path]:
    """Save ``fig`` as ``png`` and beside it as SVG (no date in the SVG, so a rerun writes the
    same bytes), close it, and return both paths."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    png = Path(png)
    paths = [png, png.with_suffix(".svg")]
    for p in paths:
        fig.savefig(p, **({"metadata": {"Date": None}} if p.suffix == ".svg" else {}))
    plt.close(fig)
    return paths


def describe_mapping(result: SearchResult, graph: Graph) -> str:
    """One line per set: devices, design and the layer range it runs."""
    return "\n".join(KINDS[PlanKind.MAPPING].describe(result.best, graph))


def _config_figures(e) -> list[str]:
    return [f"  MFU {e.mfu:.1%}, memory peak {e.memory_peak / 2**30:.2f} GiB per GPU"] if e.mfu == e.mfu else []


def _deployment_figures(e) -> list[str]:
    from .result import deployment_figures

    return [f"  {deployment_figures(e)}"]


_FIGURES = {PlanKind.MAPPING: lambda e: [], PlanKind.PARALLEL: _config_figures,
            PlanKind.DEPLOYMENT: _deployment_figures}
"""A kind's simulated figures as lines under its plan."""


def describe_best(result: SearchResult, graph: Graph) -> str:
    """The best plan in a few lines: a mapping's sets, a configuration's or a deployment's
    settings and figures."""
    spec = kind_of(result.best)
    return "\n".join(spec.describe(result.best, graph) + _FIGURES[spec.kind](result.evaluation))


def describe_deployment(dep: Deployment, e) -> str:
    """A deployment's pools (one line each) and its simulated figures."""
    return "\n".join(KINDS[PlanKind.DEPLOYMENT].describe(dep, None) + _deployment_figures(e))


def equivalence_key(cfg: ParallelConfig, evaluation, objective: str = "latency") -> tuple:
    """Configurations that differ only in where their ranks sit (``order``, ``stage_start``) and
    evaluate to the same value at 12 digits are one configuration to a reader of the top list."""
    from dataclasses import replace

    from .evaluate import rank_value

    return (replace(cfg, order="tp-pp-dp", stage_start=()), rank_value(evaluation.fitness(objective)))


def deployment_class(dep: Deployment, evaluation) -> tuple:
    """Deployments of the same pools and parallelism whose engine settings give the same figures
    (at 12 digits) are one deployment to a reader of the top list."""
    from .evaluate import rank_value

    figures = tuple(rank_value(evaluation.latency.get(k, float("nan"))) for k in ("ttft_p99", "tbt_p99", "e2e_mean"))
    return (tuple((p.role, p.gpu, p.replicas, p.tp, p.pp) for p in dep.pools), rank_value(evaluation.goodput),
            rank_value(evaluation.rate), figures)


def _top_deployments(result: SearchResult, n: int, evaluation: dict) -> list[Candidate]:
    top = result.top(n, key=lambda p: deployment_class(p, evaluation[plan_key(p)]))
    # simulated deployments meeting the constraints first (stable: each group by fitness)
    return sorted(top, key=lambda c: not meets_slo(c))


_TOP = {PlanKind.MAPPING: lambda result, n, evaluation: result.top(n),
        PlanKind.PARALLEL: lambda result, n, evaluation: result.top(
            n, key=lambda p: equivalence_key(p, evaluation[plan_key(p)], result.objective)),
        PlanKind.DEPLOYMENT: _top_deployments}
"""A kind's best candidates, equivalent plans once."""


def top_candidates(result: SearchResult, n: int = 10) -> list[Candidate]:
    """The ``n`` best candidates, simulated ones first, equivalent configurations once
    (:func:`equivalence_key`)."""
    evaluation = {plan_key(c.plan): c.evaluation for c in result.candidates}
    return _TOP[kind_of(result.best).kind](result, n, evaluation)


def top_rows(result: SearchResult, n: int = 10) -> list[dict]:
    """The ``n`` best candidates (:func:`top_candidates`) as records: plan, simulated and screened
    time (ms), and for a configuration MFU, memory peak (GiB), bubble and exposed communication
    per group (ms), time to first token and per output token (ms)."""
    return [_row(c) for c in top_candidates(result, n)]


def _ms(x: float | None) -> float:
    return x * 1e3 if x is not None and x == x else float("nan")


def _times(c: Candidate, plan: str) -> dict:
    sim, scr = c.simulated, c.screened
    return {"plan": plan, "simulated_ms": _ms(sim.makespan) if sim else float("nan"),
            "screened_ms": _ms(scr.makespan) if scr else float("nan")}


def _mapping_row(c: Candidate) -> dict:
    return {**_times(c, plan_key(c.plan)[:12]), "sets": len(c.plan.sets), "stages": c.plan.n_stages,
            "micro_batches": c.plan.micro_batches}


def _config_row(c: Candidate) -> dict:
    e = c.evaluation
    return {**_times(c, c.plan.text()), "mfu": e.mfu, "memory_peak_GiB": e.memory_peak / 2**30,
            "bubble_ms": _ms(e.exposed.get("bubble")),
            **{f"exposed_{k}_ms": _ms(v) for k, v in sorted(e.exposed.items()) if k != "bubble"},
            "ttft_ms": _ms(e.ttft), "tpot_ms": _ms(e.tpot)}


def _row(c: Candidate) -> dict:
    return _ROWS[kind_of(c.plan).kind](c)


SIMULATED, SCREEN_ONLY = "simulated", "screen only"
"""Where a deployment's figures come from: its simulation, or the closed-form screen alone."""


def deployment_source(c: Candidate) -> str:
    """:data:`SIMULATED` or :data:`SCREEN_ONLY`."""
    return SIMULATED if c.simulated is not None else SCREEN_ONLY


def meets_slo(c: Candidate) -> bool:
    """Whether a deployment's *simulation* meets the constraints: a screen's figures never count
    (the closed form's TTFT tail is its weakest part: a deployment screened well within a bound
    can simulate far outside it)."""
    e = c.simulated
    return e is not None and e.feasible and e.slo_met


def _deployment_row(c: Candidate) -> dict:
    """A deployment's record: its text, GPUs, and the figures of its simulation (or, screened
    only, of the screen; ``simulated`` says which): rate and goodput (requests/s), latency
    percentiles (ms), output tokens/s, dollars per million output tokens, the constraints'
    ratio; the screen's rate, goodput, TTFT and TBT P99 beside them. ``source`` says where the
    figures come from (``simulated``, ``screen only``); ``meets_slo`` is True only for a simulation
    that meets the constraints (:func:`meets_slo`), never for a screen."""
    e = c.evaluation
    row = {"deployment": c.plan.text(), "source": deployment_source(c), "meets_slo": meets_slo(c),
           "simulated": c.simulated is not None, "gpus": e.gpus, "rate_rps": e.rate, "goodput_rps": e.goodput}
    for m in ("ttft", "tbt", "tpot", "e2e"):
        for st in ("p50", "p99"):
            row[f"{m}_{st}_ms"] = e.latency.get(f"{m}_{st}", float("nan")) * 1e3
    row.update(output_tokens_per_s=e.throughput, cost_per_mtok=e.cost_per_mtok, slo_ratio=e.slo_ratio,
               runs=e.runs)
    scr = c.screened
    if scr is not None:
        row.update(screened_rate_rps=scr.rate, screened_goodput_rps=scr.goodput,
                   screened_ttft_p99_ms=scr.latency.get("ttft_p99", float("nan")) * 1e3,
                   screened_tbt_p99_ms=scr.latency.get("tbt_p99", float("nan")) * 1e3,
                   screened_capacity_rps=scr.capacity)
    return row


_ROWS = {PlanKind.MAPPING: _mapping_row, PlanKind.PARALLEL: _config_row, PlanKind.DEPLOYMENT: _deployment_row}
"""A kind's record of a candidate."""


def _format_top_deployments(result: SearchResult, cands: list[Candidate]) -> str:
    goodput = result.objective == "goodput"
    col = max([46, *(len(short_deployment(c.plan)) + 1 for c in cands)])  # widened, never cut
    head = (f"{'#':>2}  {'deployment':<{col}}{'source':>8}{'SLO':>7}{'GPUs':>6}{'goodput' if goodput else 'req/s':>9}"
            f"{'TTFT P99':>10}{'TBT P99':>9}{'tok/s':>10}{'$/Mtok':>9}")
    lines = [head, f"{'':<{col + 17}}{'':>6}{'req/s':>9}{'ms':>10}{'ms':>9}"]
    screen_rows = False
    for i, c in enumerate(cands, start=1):
        e = c.evaluation
        if c.simulated is None and not screen_rows:
            screen_rows = True
            lines.append("    screened only, not simulated: the closed form's figures; whether they meet the "
                         "constraints is not known")
        rate = e.goodput if goodput else e.rate
        cost = f"{e.cost_per_mtok:>9.3g}" if e.cost_per_mtok == e.cost_per_mtok else f"{'-':>9}"
        slo = "met" if meets_slo(c) else "?" if c.simulated is None else "missed"
        line = (f"{i:>2}  {short_deployment(c.plan):<{col}}{'sim' if c.simulated is not None else 'screen':>8}"
                f"{slo:>7}{e.gpus:>6d}{rate:>9.4g}{_num_cell(e.latency.get('ttft_p99', float('nan')) * 1e3, 10)}"
                f"{_num_cell(e.latency.get('tbt_p99', float('nan')) * 1e3, 9)}{e.throughput:>10.4g}{cost}")
        lines.append(line)
    lines.append("(source sim: simulated, SLO met: its simulation meets the constraints; screen: the closed form "
                 "only,\n SLO ?: not known; engine settings that change no figure shown once)")
    return "\n".join(lines)


def _num_cell(x: float, width: int) -> str:
    return f"{'-':>{width}}" if x != x else f"{x:>{width}.3f}"


def format_top(result: SearchResult, n: int = 10) -> str:
    """The ``n`` best candidates as aligned text (the plan column as wide as its longest entry):
    simulated ones first; for configurations MFU, memory and where the time not computing went (the pipeline
    bubble, or for serving the time to first token and per output token, and the two groups with
    the most exposed communication)."""
    cands = top_candidates(result, n)
    if not cands:
        return "(no candidate evaluated)"
    return _FORMAT_TOP[kind_of(result.best).kind](result, cands)


def _format_top_plans(result: SearchResult, cands: list[Candidate], parallel: bool) -> str:
    """The top table of mappings (``parallel`` False) or configurations."""
    spec = kind_of(result.best)
    plans, noun = [spec.short(c.plan) for c in cands], spec.noun
    rows = [_row(c) for c in cands]
    serving = parallel and any(r["tpot_ms"] == r["tpot_ms"] for r in rows)
    col = max([44, *(len(p) + 1 for p in plans)])  # widened to the longest, never cut
    head = f"{'#':>2}  {noun:<{col}}{'sim ms':>10}{'screen ms':>10}"
    if parallel:
        head += f"{'MFU':>7}{'mem GiB':>8}" + (f"{'TTFT ms':>9}{'TPOT ms':>9}" if serving else f"{'bubble ms':>10}")
        head += "  exposed ms"
    else:
        head += f"{'sets':>6}{'stages':>7}{'micro':>6}"
    lines = [head]
    for i, (r, c, plan) in enumerate(zip(rows, cands, plans), start=1):
        line = f"{i:>2}  {plan:<{col}}{_num_cell(r['simulated_ms'], 10)}{_num_cell(r['screened_ms'], 10)}"
        if parallel:
            line += f"{r['mfu']:>7.1%}" if r["mfu"] == r["mfu"] else f"{'-':>7}"
            mem = r["memory_peak_GiB"]
            line += f"{mem:>8.1f}" if mem == mem else f"{'-':>8}"
            line += (_num_cell(r["ttft_ms"], 9) + _num_cell(r["tpot_ms"], 9)) if serving else \
                _num_cell(r["bubble_ms"], 10)
            groups = sorted(((v, k[len("exposed_"):-len("_ms")].upper()) for k, v in r.items()
                             if k.startswith("exposed_") and v == v and v > 0), reverse=True)[:2]
            line += "  " + (" ".join(f"{g} {v:.1f}" for v, g in groups) or "-")
        else:
            line += f"{r['sets']:>6}{r['stages']:>7}{r['micro_batches']:>6}"
        lines.append(line)
    lines.append("('-': screened only, not simulated; equivalent placements shown once)" if parallel else
                 "('-': screened only, not simulated)")
    return "\n".join(lines)


_FORMAT_TOP = {PlanKind.MAPPING: lambda result, cands: _format_top_plans(result, cands, False),
               PlanKind.PARALLEL: lambda result, cands: _format_top_plans(result, cands, True),
               PlanKind.DEPLOYMENT: _format_top_deployments}
"""A kind's table of its best candidates."""


def search_summary(result: SearchResult, graph: Graph | None, system: System) -> dict:
    """What ``search.json`` holds: algorithm, objective, seed, fitness, makespan (s), throughput,
    energy (J), counts, wall time (s), system, workload, the best plan (a mapping's key, a
    configuration's settings and report figures) and notes (JSON-ready: NaN and infinities
    become null)."""
    e = result.evaluation
    out = {
        "algorithm": result.algorithm, "objective": result.objective, "seed": result.seed,
        "fitness": _num(result.fitness), "makespan_s": _num(result.makespan),
        "throughput": _num(e.throughput),
        "simulations": result.simulations, "estimates": result.estimates, "rejected_memory": result.rejected_memory,
        "wall_s": result.wall_s, "interrupted": result.interrupted, "system": system.spec,
        "workload": graph.spec if graph is not None else None,
        "notes": _json_ready(result.notes),
    }
    out.update(_SUMMARY[kind_of(result.best).kind](result.best, e))
    return out


def _deployment_summary(dep: Deployment, e) -> dict:
    from marssim.serve.deployment import deployment_to_dict

    return dict(best=deployment_to_dict(dep), best_text=dep.text(), energy_j=None, gpus=e.gpus, rate_rps=_num(e.rate),
                goodput_rps=_num(e.goodput), output_tokens_per_s=_num(e.throughput),
                cost_per_mtok=_num(e.cost_per_mtok), slo_ratio=_num(e.slo_ratio), simulation_runs=e.runs,
                latency_s={k: _num(v) for k, v in sorted(e.latency.items())})


def _config_summary(cfg: ParallelConfig, e) -> dict:
    return dict(best=cfg.to_dict(), best_text=cfg.text(), energy_j=_num(e.energy), mfu=_num(e.mfu),
                ttft_s=_num(e.ttft), tpot_s=_num(e.tpot), memory_peak_bytes=_num(e.memory_peak),
                exposed_s={k: _num(v) for k, v in e.exposed.items()})


_SUMMARY = {PlanKind.MAPPING: lambda m, e: {"mapping_key": m.key, "energy_j": _num(e.energy)},
            PlanKind.PARALLEL: _config_summary,
            PlanKind.DEPLOYMENT: _deployment_summary}
"""A kind's best plan and figures in ``search.json`` (``energy_j`` null for a deployment, which has no
energy figure)."""


def _json_ready(value):
    """``value`` as JSON holds it: mappings and sequences kept as such (``notes.timing`` stays an
    object), numbers as numbers (NaN and infinities null), anything else as its text."""
    if isinstance(value, dict):
        return {str(k): _json_ready(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_ready(v) for v in value]
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return _num(float(value))
    return str(value)


def _num(x: float) -> float | None:
    return x if x == x and math.isfinite(x) else None
