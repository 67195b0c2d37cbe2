"""Validate the analytical estimate (and a user's own numbers) against the simulator.

For every mapping: lower it once, estimate it (:func:`marssim.analytical.estimate`), simulate it
(no timelines), and record the relative error ``(estimate - simulation) / simulation``. Over all
mappings: the median, 90th percentile and largest absolute error, how many estimates came out
above the simulation, and the rank correlation of the two (Kendall's tau and Spearman's rho: does
the estimate order mappings the way the simulation does, which is what a search needs).

Where they differ, the difference is contention, and :func:`attribute` says whose: walking the
simulated critical path back from the last task, every transfer on it that took longer than it
would alone charges its extra time to the resources of its route that another flow was using at
the same time, and every compute task that waited for its device longer than it does in the
estimate charges the extra wait to that device. Units: seconds.
"""

from __future__ import annotations

import csv
import math
import pickle
import hashlib
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from marssim.errors import CapacityError, InputError
from marssim.mapping import Mapping
from marssim.system import System
from marssim.taskgraph import COMPUTE, TaskGraph
from marssim.workload import Graph

__all__ = ["NamedMapping", "Comparison", "UserEstimates", "ValidationReport", "validate", "compare",
           "sample_mappings", "load_mapping_dir", "read_estimates", "attribute", "op_times", "FAMILIES"]

FAMILIES = ("random", "pipeline", "collective")
"""How sampled mappings are drawn: ``random`` (uniform over the mapping space), ``pipeline``
(at least two sets, the most micro-batches allowed: devices queue micro-batches and stages share
links) and ``collective`` (output- or input-channel sharding wherever legal: all-gathers,
reduce-scatters and all-reduces on every layer)."""

_TOP = 3  # resources named per mapping


@dataclass(frozen=True)
class NamedMapping:
    """A mapping with the name it is reported under (file stem or sample id) and its family."""

    name: str
    mapping: Mapping
    family: str = "given"


@dataclass(frozen=True)
class Comparison:
    """One mapping evaluated both ways (seconds). ``error``: ``(estimate - simulated) / simulated``
    (NaN when the mapping does not fit memory: ``feasible`` False, ``problem`` says why).
    ``delays``: seconds of the simulated critical path charged to each resource (links, switches,
    memories by name; ``device order`` for what contention-free ordering does not explain).
    ``op_sim_s``/``op_est_s``: simulated and estimated seconds per op (see :func:`op_times`;
    filled only when per-layer estimates are compared)."""

    name: str
    key: str
    family: str
    sets: int
    stages: int
    micro_batches: int
    tasks: int
    estimate_s: float
    simulated_s: float
    lower_bound_s: float
    error: float
    bounded_s: float = math.nan
    feasible: bool = True
    problem: str = ""
    estimate_wall_s: float = 0.0
    simulate_wall_s: float = 0.0
    link_delay_s: float = 0.0  # extra seconds of all transfers over their contention-free time
    wait_s: float = 0.0  # seconds compute tasks spent ready but waiting for their device, simulated
    wait_estimate_s: float = 0.0  # the same in the estimate
    delays: dict[str, float] = field(default_factory=dict)
    op_sim_s: dict[str, float] = field(default_factory=dict)
    op_est_s: dict[str, float] = field(default_factory=dict)

    @property
    def top_resources(self) -> str:
        """The resources that explain most of the gap, with their share: ``a->b 71%; c:mem 20%``."""
        total = sum(self.delays.values())
        if total <= 0:
            return ""
        top = sorted(self.delays.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOP]
        return "; ".join(f"{name} {value / total:.0%}" for name, value in top)


@dataclass(frozen=True)
class UserEstimates:
    """A user's own numbers read from a CSV: per mapping (``makespan_s`` by mapping name or key)
    or per layer (``time_s`` by op name, optionally per mapping)."""

    file: str
    kind: str  # "mapping" or "layer"
    makespan: dict[str, float] = field(default_factory=dict)  # mapping name/key -> s
    layers: tuple[tuple[str, str, float, int], ...] = ()  # (mapping or "", op, s, csv row)


# ---------------------------------------------------------------------- one mapping
def compare(graph: Graph, system: System, item: NamedMapping, cost=None, *, memory_policy: str = "error",
            want_ops: bool = False) -> Comparison:
    """Lower ``item.mapping`` once, estimate and simulate it, and attribute the gap."""
    from marssim.analytical import estimate
    from marssim.lower import lower
    from marssim.sim import simulate

    m = item.mapping
    tg = lower(graph, system, m, cost, validate=False)
    t0 = time.perf_counter()
    est = estimate(tg, system)
    t1 = time.perf_counter()
    base = dict(name=item.name, key=m.key, family=item.family, sets=len(m.sets), stages=m.n_stages,
                micro_batches=m.micro_batches, tasks=tg.n_tasks, estimate_s=est.makespan,
                lower_bound_s=est.lower_bound, bounded_s=est.bounded, estimate_wall_s=t1 - t0)
    try:
        sim = simulate(tg, system, memory_policy=memory_policy, record=False, setup=False)
    except CapacityError as err:
        return Comparison(**base, simulated_s=math.nan, error=math.nan, feasible=False, problem=str(err),
                          simulate_wall_s=time.perf_counter() - t1)
    wall = time.perf_counter() - t1
    log = sim.intervals
    log = log[log["task"] >= 0].sort_values("task")
    start = log["start"].to_numpy()
    end = log["end"].to_numpy()
    delays, link_delay = attribute(tg, system, est, start, end)
    wait = _device_wait(tg, start, end)
    ops = op_times(tg, start, end) if want_ops else {}
    ops_est = op_times(tg, est.start, est.end) if want_ops else {}
    error = (est.makespan - sim.makespan) / sim.makespan if sim.makespan > 0 else 0.0
    return Comparison(**base, simulated_s=sim.makespan, error=error, simulate_wall_s=wall,
                      link_delay_s=link_delay, wait_s=wait, wait_estimate_s=float((est.start - est.ready).sum()),
                      delays=delays, op_sim_s=ops, op_est_s=ops_est)


def _device_wait(tg: TaskGraph, start: np.ndarray, end: np.ndarray) -> float:
    """Seconds compute tasks spent between their predecessors' end and their own start."""
    if tg.n_tasks == 0:
        return 0.0
    counts = np.diff(tg.pred_ptr)
    ready = np.zeros(tg.n_tasks)
    np.maximum.at(ready, np.repeat(np.arange(tg.n_tasks), counts), end[tg.pred_idx])
    comp = tg.kind == COMPUTE
    return float((start[comp] - ready[comp]).sum())


def attribute(tg: TaskGraph, system: System, est, start: np.ndarray, end: np.ndarray) -> tuple[dict[str, float], float]:
    """Charge the gap between simulation and estimate to resources (see the module docstring).

    ``start``/``end``: the simulated times per task (s). The simulated makespan is the sum of
    the simulated durations along its critical path; each transfer on it took its contention-free
    duration plus some extra, charged to the resource(s) of its route that squeezed it most. When
    every device runs its tasks in the same order in both schedules, the charged seconds are at
    least the gap; what the gap exceeds them by is charged to ``device order``. Returns
    ``(delays, link_delay_s)``: seconds per resource name, and the extra seconds of all transfers
    (on the critical path or not)."""
    from marssim.analytical import critical_path

    is_transfer = tg.kind != COMPUTE
    extra = np.maximum(np.where(is_transfer, (end - start) - est.duration, 0.0), 0.0)
    link_delay = float(extra.sum())
    names = system.resource_names
    delays: dict[str, float] = {}
    path = critical_path(tg, start, end)
    on_path = path[is_transfer[path]]
    on_path = on_path[extra[on_path] > 1e-12 * float(end.max(initial=0.0))]
    if len(on_path):
        shared = _shared_resources(tg, system, start, end)
        for t in on_path.tolist():
            res = shared.get(t) or _bottleneck(tg, system, t)
            for r in res:
                delays[names[r]] = delays.get(names[r], 0.0) + extra[t] / len(res)
    gap = float(end.max(initial=0.0)) - est.makespan
    residual = gap - sum(delays.values())
    if residual > 1e-9 * max(gap, 1e-30) and residual > 1e-15:
        delays["device order"] = residual
    return delays, link_delay


def _bottleneck(tg: TaskGraph, system: System, t: int) -> tuple[int, ...]:
    res = tg.routes[tg.route[t]].resources
    if not res:
        return ()
    cap = system.resource_capacity[list(res)]
    return (res[int(np.argmin(cap))],)


def _shared_resources(tg: TaskGraph, system: System, start: np.ndarray, end: np.ndarray) -> dict[int, tuple[int, ...]]:
    """For each transfer that overlapped another flow on some resource of its route, the
    resource(s) that squeezed it most: the smallest capacity per concurrent flow (its capacity
    over one plus the flows that overlapped it there; ties all count)."""
    transfers = np.flatnonzero((tg.kind != COMPUTE) & (tg.nbytes > 0))
    by_resource: dict[int, list[int]] = {}
    for t in transfers.tolist():
        for r in tg.routes[tg.route[t]].resources:
            by_resource.setdefault(r, []).append(t)
    cap = system.resource_capacity
    best: dict[int, tuple[float, list[int]]] = {}
    for r, members in sorted(by_resource.items()):
        if len(members) < 2:
            continue
        idx = np.asarray(members)
        s, e = start[idx], end[idx]
        others = np.zeros(len(idx), dtype=np.int64)
        for lo in range(0, len(idx), 1024):  # blocks keep the overlap matrix small
            blk = slice(lo, lo + 1024)
            ov = (s[blk, None] < e[None, :]) & (s[None, :] < e[blk, None])
            others[blk] = ov.sum(axis=1) - 1
        for t, k in zip(idx[others > 0].tolist(), others[others > 0].tolist()):
            share = float(cap[r]) / (1 + k)
            cur = best.get(t)
            if cur is None or share < cur[0] * (1 - 1e-12):
                best[t] = (share, [r])
            elif share <= cur[0] * (1 + 1e-12):
                cur[1].append(r)
    return {t: tuple(rs) for t, (_, rs) in best.items()}


def op_times(tg: TaskGraph, start: np.ndarray, end: np.ndarray) -> dict[str, float]:
    """Seconds each op spends computing: per micro-batch, from its first shard's start to its
    last shard's end, summed over micro-batches (transfers excluded)."""
    comp = tg.kind == COMPUTE
    frame = pd.DataFrame({"op": tg.op[comp], "mb": tg.micro_batch[comp], "start": start[comp], "end": end[comp]})
    frame = frame[frame["op"] >= 0]
    if frame.empty:
        return {}
    g = frame.groupby(["op", "mb"], sort=True)
    span = (g["end"].max() - g["start"].min()).groupby(level=0).sum()
    return {tg.op_names[int(o)]: float(v) for o, v in span.items()}


# ---------------------------------------------------------------------- many mappings
def validate(graph: Graph, system: System, mappings: Sequence[NamedMapping], cost=None, *,
             memory_policy: str = "error", estimates: UserEstimates | None = None, executor: Executor | None = None,
             progress: Callable[[int, int], None] | None = None, meta: dict[str, Any] | None = None) -> "ValidationReport":
    """Compare estimate and simulation on every mapping; see :class:`ValidationReport`.

    ``cost``: the cost model (default :func:`marssim.cost.default_cost_model`). ``estimates``: a
    user's numbers to compare as well (checked against the mapping and op names first).
    ``executor``: evaluate mappings in parallel on it (results keep the order given)."""
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    names = [m.name for m in mappings]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise ValueError(f"mapping names must be unique; {dup!r} appears twice")
    want_ops = estimates is not None and estimates.kind == "layer"
    if estimates is not None:
        _check_estimates(estimates, mappings, graph)
    results: list[Comparison] = []
    wall = time.perf_counter()
    if executor is None or len(mappings) < 2:
        for i, item in enumerate(mappings):
            results.append(compare(graph, system, item, cost, memory_policy=memory_policy, want_ops=want_ops))
            if progress:
                progress(i + 1, len(mappings))
    else:
        blob = pickle.dumps((graph, system, cost), protocol=pickle.HIGHEST_PROTOCOL)
        key = hashlib.sha1(blob).hexdigest()
        args = [(key, blob, item, memory_policy, want_ops) for item in mappings]
        for i, res in enumerate(executor.map(_compare_task, args)):
            results.append(res)
            if progress:
                progress(i + 1, len(mappings))
    info = {"system": system.name, "workload": graph.spec, "mappings": len(mappings),
            "wall_s": time.perf_counter() - wall}
    info.update(meta or {})
    return ValidationReport.build(results, estimates, info)


_PROBLEMS: dict[str, tuple] = {}


def _compare_task(args) -> Comparison:
    key, blob, item, memory_policy, want_ops = args
    problem = _PROBLEMS.get(key)
    if problem is None:
        _PROBLEMS.clear()
        problem = _PROBLEMS[key] = pickle.loads(blob)
    graph, system, cost = problem
    return compare(graph, system, item, cost, memory_policy=memory_policy, want_ops=want_ops)


# ---------------------------------------------------------------------- the report
@dataclass
class ValidationReport:
    """Per-mapping comparisons (``rows``), their summary statistics (``summary``), the resources
    whose contention explains the largest gaps (``attribution``) and, with per-layer user
    estimates, the per-layer comparison (``layers``)."""

    comparisons: list[Comparison]
    rows: pd.DataFrame
    summary: dict[str, Any]
    attribution: pd.DataFrame
    layers: pd.DataFrame | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def build(cls, comparisons: list[Comparison], estimates: UserEstimates | None,
              meta: dict[str, Any]) -> "ValidationReport":
        rows = pd.DataFrame([{
            "mapping": c.name, "key": c.key[:12], "family": c.family, "sets": c.sets, "stages": c.stages,
            "micro_batches": c.micro_batches, "tasks": c.tasks, "simulated_s": c.simulated_s,
            "estimate_s": c.estimate_s, "error": c.error, "abs_error": abs(c.error),
            "lower_bound_s": c.lower_bound_s, "bounded_s": c.bounded_s,
            "bounded_error": (c.bounded_s - c.simulated_s) / c.simulated_s if c.feasible else math.nan,
            "link_delay_s": c.link_delay_s, "wait_s": c.wait_s, "wait_estimate_s": c.wait_estimate_s,
            "explained_s": sum(c.delays.values()), "top_resources": c.top_resources,
            "feasible": c.feasible, "problem": c.problem,
        } for c in comparisons], columns=[
            "mapping", "key", "family", "sets", "stages", "micro_batches", "tasks", "simulated_s", "estimate_s",
            "error", "abs_error", "lower_bound_s", "bounded_s", "bounded_error", "link_delay_s", "wait_s",
            "wait_estimate_s", "explained_s",
            "top_resources", "feasible", "problem"])
        layers = None
        user_summary: dict[str, Any] = {}
        if estimates is not None and estimates.kind == "mapping":
            by_key = {c.key: c.name for c in comparisons}
            user = {}
            for ref, value in estimates.makespan.items():
                user[_resolve_name(ref, rows["mapping"].tolist(), by_key)] = value
            rows["user_s"] = rows["mapping"].map(user).astype(float)
            rows["user_error"] = (rows["user_s"] - rows["simulated_s"]) / rows["simulated_s"]
            ok = rows["feasible"] & rows["user_s"].notna()
            user_summary = _stats(rows.loc[ok, "user_s"].to_numpy(), rows.loc[ok, "simulated_s"].to_numpy())
        elif estimates is not None:
            layers = _layer_table(comparisons, estimates)
            ok = layers["simulated_s"] > 0
            user_summary = _stats(layers.loc[ok, "user_s"].to_numpy(), layers.loc[ok, "simulated_s"].to_numpy())
        ok = rows["feasible"].to_numpy(dtype=bool)
        summary = _stats(rows.loc[ok, "estimate_s"].to_numpy(), rows.loc[ok, "simulated_s"].to_numpy())
        summary["bounded"] = _stats(rows.loc[ok, "bounded_s"].to_numpy(), rows.loc[ok, "simulated_s"].to_numpy())
        summary["infeasible"] = int((~ok).sum())
        summary["lower_bound_holds"] = bool((rows.loc[ok, "lower_bound_s"]
                                             <= rows.loc[ok, "simulated_s"] * (1 + 1e-9)).all())
        # wall-clock timings stay out of the files (they would make them differ run to run)
        walls = [(c.simulate_wall_s, c.estimate_wall_s) for c in comparisons if c.feasible]
        summary["speedup_median"] = (float(np.median([s_ / max(e_, 1e-9) for s_, e_ in walls]))
                                     if walls else math.nan)
        if user_summary:
            summary["user"] = user_summary
        attribution = _attribution(comparisons)
        summary["worst_n"] = attribution.attrs.get("worst_n", 0)
        return cls(comparisons, rows, summary, attribution, layers, dict(meta))

    def text(self) -> str:
        """The summary as readable lines (what ``summary.txt`` holds)."""
        s = self.summary
        m = self.meta
        lines = [f"{m.get('system', '')} / {m.get('workload', '')}: {m.get('mappings', len(self.rows))} mappings"
                 + (f" (sampled, seed {m['seed']})" if "seed" in m else ""),
                 ""]
        lines += _stats_lines("analytical estimate (no link contention)", s)
        if s.get("infeasible"):
            lines.append(f"  {s['infeasible']} mappings do not fit memory (left out)")
        lines.append(f"  lower bound at or below the simulation for every mapping: {'yes' if s['lower_bound_holds'] else 'NO'}")
        lines.append("")
        lines += _stats_lines("max(estimate, lower bound)", s["bounded"])
        if "user" in s:
            lines.append("")
            what = "per layer" if self.layers is not None else "per mapping"
            lines += _stats_lines(f"user estimates ({what})", s["user"])
        if len(self.attribution):
            lines.append("")
            lines.append(f"contention behind the largest gaps ({self.summary.get('worst_n', 0)} mappings "
                         f"with the largest |error|; seconds of their simulated critical paths):")
            lines.append(f"  {'resource':<28}{'kind':<9}{'delay':>12}{'share':>8}{'mappings':>10}")
            for row in self.attribution.head(10).itertuples():
                lines.append(f"  {row.resource:<28}{row.kind:<9}{row.delay_s * 1e3:>10.4f}ms{row.share:>8.0%}"
                             f"{row.mappings:>10}")
        worst = self.rows[self.rows["feasible"]].sort_values("abs_error", ascending=False).head(5)
        if len(worst):
            lines.append("")
            lines.append("largest errors:")
            for row in worst.itertuples():
                lines.append(f"  {row.mapping:<22}{row.error:>+9.1%}  sim {row.simulated_s * 1e3:.4f} ms, "
                             f"est {row.estimate_s * 1e3:.4f} ms, {row.stages} stages, {row.micro_batches} mb"
                             + (f"  [{row.top_resources}]" if row.top_resources else ""))
        return "\n".join(lines)

    def save(self, directory: str | Path) -> list[Path]:
        """Write ``validate.csv``, ``summary.txt``, ``attribution.csv``, ``scatter.png`` and
        ``scatter.svg`` (and ``layers.csv`` with per-layer estimates) into ``directory``,
        atomically. Returns the paths."""
        from marssim.fsutil import staged_dir

        directory = Path(directory)
        names = ["validate.csv", "summary.txt", "attribution.csv", "scatter.png", "scatter.svg"]
        with staged_dir(directory) as tmp:
            self.rows.to_csv(tmp / "validate.csv", index=False, float_format="%.9g")
            (tmp / "summary.txt").write_text(self.text() + "\n")
            self.attribution.to_csv(tmp / "attribution.csv", index=False, float_format="%.9g")
            if self.layers is not None:
                self.layers.to_csv(tmp / "layers.csv", index=False, float_format="%.9g")
                names.append("layers.csv")
            scatter_plot(self, tmp / "scatter.png")
        return [directory / n for n in names]


def _stats(est: np.ndarray, sim: np.ndarray) -> dict[str, Any]:
    from scipy import stats

    err = (est - sim) / sim
    out: dict[str, Any] = {"n": int(len(err))}
    if len(err) == 0:
        return out
    a = np.abs(err)
    out.update({"median_abs_error": float(np.median(a)), "p90_abs_error": float(np.percentile(a, 90)),
                "max_abs_error": float(a.max()), "mean_error": float(err.mean()),
                "above": int((err > 1e-9).sum()), "exact": int((a <= 1e-9).sum())})
    if len(err) >= 2 and np.ptp(sim) > 0 and np.ptp(est) > 0:
        out["kendall_tau"] = float(stats.kendalltau(est, sim).statistic)
        out["spearman_rho"] = float(stats.spearmanr(est, sim).statistic)
    else:
        out["kendall_tau"] = out["spearman_rho"] = math.nan
    return out


def _stats_lines(title: str, s: dict[str, Any]) -> list[str]:
    if not s.get("n"):
        return [f"{title}: nothing to compare"]
    return [f"{title} vs simulation ({s['n']} compared)",
            f"  |relative error|  median {s['median_abs_error']:.2%}   p90 {s['p90_abs_error']:.2%}   "
            f"max {s['max_abs_error']:.2%}",
            f"  equal to the simulation (|error| <= 1e-9): {s['exact']}; above it: {s['above']}",
            f"  rank correlation  Kendall tau {s['kendall_tau']:.3f}   Spearman rho {s['spearman_rho']:.3f}"]


def _attribution(comparisons: list[Comparison]) -> pd.DataFrame:
    """Resources charged over the mappings with the largest |error| (the worst tenth, at least five)."""
    ok = [c for c in comparisons if c.feasible]
    worst = sorted(ok, key=lambda c: (-abs(c.error), c.name))[:max(5, len(ok) // 10)]
    total: dict[str, float] = {}
    count: dict[str, int] = {}
    for c in worst:
        for name, value in c.delays.items():
            total[name] = total.get(name, 0.0) + value
            count[name] = count.get(name, 0) + 1
    grand = sum(total.values())
    rows = [{"resource": name, "kind": _kind_of(name), "delay_s": value,
             "share": value / grand if grand > 0 else 0.0, "mappings": count[name]}
            for name, value in total.items()]
    frame = pd.DataFrame(rows, columns=["resource", "kind", "delay_s", "share", "mappings"])
    frame = frame.sort_values(["delay_s", "resource"], ascending=[False, True]).reset_index(drop=True)
    frame.attrs["worst_n"] = len(worst)
    return frame


def _kind_of(name: str) -> str:
    if name == "device order":
        return "device"
    if name.endswith(":mem") or name.endswith(":dram"):
        return "memory"
    if name.endswith(":backplane"):
        return "switch"
    return "link"


def _layer_table(comparisons: list[Comparison], estimates: UserEstimates) -> pd.DataFrame:
    rows = []
    by_key = {c.key: c.name for c in comparisons}
    names = [c.name for c in comparisons]
    for ref, op, value, _ in estimates.layers:
        targets = [c for c in comparisons if c.name == _resolve_name(ref, names, by_key)] if ref else comparisons
        for c in targets:
            if not c.feasible:
                continue
            sim = c.op_sim_s.get(op, math.nan)
            est = c.op_est_s.get(op, math.nan)
            rows.append({"mapping": c.name, "op": op, "user_s": value, "simulated_s": sim,
                         "error": (value - sim) / sim if sim > 0 else math.nan, "estimate_s": est,
                         "estimate_error": (est - sim) / sim if sim > 0 else math.nan})
    return pd.DataFrame(rows, columns=["mapping", "op", "user_s", "simulated_s", "error", "estimate_s",
                                       "estimate_error"])


def _resolve_name(ref: str, names: Sequence[str], by_key: dict[str, str]) -> str | None:
    """The mapping a user's reference names: a mapping name, or a prefix (6+ hex digits) of
    exactly one mapping's key. None when it names none."""
    if ref in names:
        return ref
    hits = [name for key, name in by_key.items() if len(ref) >= 6 and key.startswith(ref.lower())]
    return hits[0] if len(hits) == 1 else None


# ---------------------------------------------------------------------- the scatter plot
def scatter_plot(report: ValidationReport, path: str | Path) -> list[Path]:
    """Estimate against simulation on log-log axes with the line y = x, one point per mapping
    coloured by its number of pipeline stages: the contention-free estimate on the left,
    ``max(estimate, lower bound)`` on the right (and the user's numbers as crosses, if given).
    Writes ``path`` (PNG) and the same stem as SVG; returns both paths."""
    import matplotlib

    matplotlib.use("Agg", force=False)
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    path = Path(path)
    rows = report.rows[report.rows["feasible"]]
    panels = [("estimate_s", "analytical estimate, no link contention (ms)", report.summary),
              ("bounded_s", "max(estimate, lower bound) (ms)", report.summary.get("bounded", {}))]
    with matplotlib.rc_context({"svg.hashsalt": "marssim", "font.size": 9}):
        fig, axes = plt.subplots(1, 2, figsize=(11, 5.2))
        sim = rows["simulated_s"].to_numpy() * 1e3
        stages = rows["stages"].to_numpy()
        levels = sorted(set(stages.tolist()))
        cmap = plt.get_cmap("viridis")
        values = [rows[col].to_numpy() * 1e3 for col, _, _ in panels]
        if "user_s" in rows:
            values.append(rows["user_s"].dropna().to_numpy() * 1e3)
        finite = np.concatenate([sim] + values) if len(rows) else np.zeros(0)
        finite = finite[np.isfinite(finite) & (finite > 0)]
        lo, hi = (finite.min() / 1.3, finite.max() * 1.3) if len(finite) else (0.1, 10.0)
        for ax, (col, label, st), y in zip(axes, panels, values):
            for k, n_st in enumerate(levels):
                sel = stages == n_st
                ax.scatter(sim[sel], y[sel], s=14, color=cmap(k / max(len(levels) - 1, 1)), alpha=0.8,
                           edgecolors="none", label=f"{n_st} stage{'s' if n_st != 1 else ''}")
            if "user_s" in rows and col == "estimate_s":
                sel = rows["user_s"].notna().to_numpy()
                if sel.any():
                    ax.scatter(sim[sel], rows["user_s"].to_numpy()[sel] * 1e3, s=22, marker="x", color="crimson",
                               label="user estimate")
            ax.plot([lo, hi], [lo, hi], color="black", lw=1, ls="--", label="y = x")
            ax.set_xlim(lo, hi)
            ax.set_ylim(lo, hi)
            ax.set_xscale("log")
            ax.set_yscale("log")
            for axis in (ax.xaxis, ax.yaxis):
                axis.set_major_formatter(matplotlib.ticker.FuncFormatter(_tick_label))
                # 2, 3 and 5 labelled too when the axis spans less than two decades
                axis.set_minor_formatter(matplotlib.ticker.FuncFormatter(_tick_label) if hi / lo < 100
                                         else matplotlib.ticker.NullFormatter())
            ax.set_xlabel("simulated makespan (ms)")
            ax.set_ylabel(label)
            if st.get("n"):
                ax.set_title(f"|error| median {st['median_abs_error']:.1%}, p90 {st['p90_abs_error']:.1%}, "
                             f"max {st['max_abs_error']:.1%}\nKendall tau {st['kendall_tau']:.2f}, "
                             f"Spearman rho {st['spearman_rho']:.2f}")
            ax.grid(True, which="both", lw=0.3, alpha=0.5)
            ax.legend(loc="upper left", fontsize=8, frameon=False)
        m = report.meta
        fig.suptitle(f"{m.get('system', '')} / {m.get('workload', '')}: {len(rows)} mappings")
        fig.tight_layout()
        svg = path.with_suffix(".svg")
        fig.savefig(path, dpi=120, metadata={"Software": None})
        fig.savefig(svg, metadata={"Date": None, "Creator": None})
        plt.close(fig)
    return [path, svg]


def _tick_label(value: float, _pos=None) -> str:
    """``0.2``, ``3``, ``50``: plain numbers for ticks whose leading digit is 1, 2, 3 or 5."""
    if value <= 0:
        return ""
    lead = value / 10 ** math.floor(math.log10(value) + 1e-9)
    return f"{value:g}" if round(lead, 6) in (1.0, 2.0, 3.0, 5.0) else ""


# ---------------------------------------------------------------------- inputs
def sample_mappings(graph: Graph, system: System, n: int, *, seed: int = 0,
                    families: Sequence[str] = FAMILIES, max_sets: int | None = None,
                    micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8)) -> list[NamedMapping]:
    """``n`` distinct mappings drawn with :class:`~marssim.search.MappingSpace` under ``seed``,
    cycling through ``families`` (see :data:`FAMILIES`). Deterministic."""
    from dataclasses import replace

    from marssim.search import MappingSpace

    for f in families:
        if f not in FAMILIES:
            raise ValueError(f"unknown family {f!r}; expected {', '.join(FAMILIES)}")
    space = MappingSpace(graph, system, max_sets=max_sets, micro_batch_choices=micro_batch_choices)
    rng = np.random.default_rng(seed)
    out: list[NamedMapping] = []
    seen: set[str] = set()
    n_acc = len(space.accelerators)
    collective = tuple(tuple(s for s in opts if s in ("oc", "ic")) or opts for opts in space.layer_strategies)
    failures = 0
    while len(out) < n and failures < 20 * n + 100:
        family = families[len(out) % len(families)]
        genome = space.random(rng)
        if family == "pipeline" and space.max_sets >= 2 and n_acc >= 2:
            k = int(rng.integers(2, space.max_sets + 1))
            cut_at = set(int(c) for c in rng.choice(n_acc - 1, size=k - 1, replace=False))
            genome = replace(genome, cuts=tuple(i in cut_at for i in range(n_acc - 1)), boundaries=(),
                             assignment=(), micro_batches=max(space.micro_batch_choices))
        elif family == "collective":
            genome = replace(genome, shardings=tuple(str(rng.choice(opts)) if opts else "none" for opts in collective))
        mapping = space.decode(genome)
        if mapping.key in seen:
            failures += 1
            continue
        seen.add(mapping.key)
        out.append(NamedMapping(f"s{len(out):03d}-{family}", mapping, family))
    return out


def load_mapping_dir(directory: str | Path, graph: Graph, system: System) -> list[NamedMapping]:
    """Every ``*.yaml``/``*.yml`` mapping in ``directory`` (sorted by name), loaded for ``graph``
    on ``system`` and named by its file stem. Raises InputError for an empty or missing
    directory or a bad file."""
    from marssim.mapping import load_mapping

    directory = Path(directory)
    if not directory.is_dir():
        raise InputError(str(directory), "--mappings", "expected a directory of mapping YAML files")
    files = sorted(p for p in directory.iterdir() if p.suffix in (".yaml", ".yml") and p.is_file())
    if not files:
        raise InputError(str(directory), "--mappings", "no *.yaml mapping files in the directory")
    out = []
    for path in files:
        mapping, _, _ = load_mapping(path, system=system, workload=graph)
        out.append(NamedMapping(path.stem, mapping, "given"))
    return out


def read_estimates(path: str | Path) -> UserEstimates:
    """Read a user's estimates CSV: columns ``mapping`` and ``makespan_s`` (one row per mapping,
    named by file stem, sample name or key prefix), or ``op`` and ``time_s`` (one row per layer,
    with an optional ``mapping`` column; without it a row applies to every mapping). Raises
    InputError naming the file, the row and the column for a missing column, an empty or
    repeated name, or a value that is not a non-negative number of seconds."""
    file = str(path)
    try:
        with open(path, newline="") as handle:
            reader = csv.DictReader(handle)
            header = [h.strip() for h in (reader.fieldnames or [])]
            records = list(reader)
    except FileNotFoundError:
        raise InputError(file, "--estimates", "no such file") from None
    except (UnicodeDecodeError, csv.Error) as err:
        raise InputError(file, "--estimates", f"not a readable CSV file ({err})") from None
    cols = set(header)
    if {"op", "time_s"} <= cols:
        kind, name_col, value_col = "layer", "op", "time_s"
    elif {"mapping", "makespan_s"} <= cols:
        kind, name_col, value_col = "mapping", "mapping", "makespan_s"
    else:
        raise InputError(file, "header", "expected columns 'mapping,makespan_s' (per mapping) or 'op,time_s' "
                                         f"(per layer, optional 'mapping'); got {', '.join(header) or 'none'}")
    makespan: dict[str, float] = {}
    layers: list[tuple[str, str, float, int]] = []
    seen: set[tuple[str, str]] = set()
    for i, raw in enumerate(records, start=1):
        row = {(k or "").strip(): (v or "").strip() if isinstance(v, str) else "" for k, v in raw.items()}
        name = row.get(name_col, "")
        if not name:
            raise InputError(file, f"row {i}.{name_col}", f"expected a{'n op' if kind == 'layer' else ' mapping'} name, "
                                                          "got an empty cell")
        text = row.get(value_col, "")
        try:
            value = float(text)
        except ValueError:
            raise InputError(file, f"row {i}.{value_col}", f"expected a number of seconds, got {text!r}") from None
        if not math.isfinite(value) or value < 0:
            raise InputError(file, f"row {i}.{value_col}", f"expected a non-negative number of seconds, got {text!r}")
        if kind == "mapping":
            if name in makespan:
                raise InputError(file, f"row {i}.mapping", f"mapping {name!r} appears twice")
            makespan[name] = value
        else:
            ref = row.get("mapping", "")
            if (ref, name) in seen:
                raise InputError(file, f"row {i}.op", f"op {name!r} appears twice" + (f" for {ref!r}" if ref else ""))
            seen.add((ref, name))
            layers.append((ref, name, value, i))
    if not makespan and not layers:
        raise InputError(file, "rows", "no estimates in the file")
    return UserEstimates(file, kind, makespan, tuple(layers))


def _check_estimates(estimates: UserEstimates, mappings: Sequence[NamedMapping], graph: Graph) -> None:
    names = [m.name for m in mappings]
    by_key = {m.mapping.key: m.name for m in mappings}

    def known(ref: str) -> bool:
        return _resolve_name(ref, names, by_key) is not None

    sample = ", ".join(names[:5]) + (" ..." if len(names) > 5 else "")
    if estimates.kind == "mapping":
        for i, ref in enumerate(estimates.makespan, start=1):
            if not known(ref):
                raise InputError(estimates.file, f"row {i}.mapping",
                                 f"unknown mapping {ref!r}; expected a mapping name ({sample}) or key prefix")
        return
    ops = {graph.ops[i].name for i in graph.compute_ops}
    for ref, op, _, row in estimates.layers:
        if ref and not known(ref):
            raise InputError(estimates.file, f"row {row}.mapping",
                             f"unknown mapping {ref!r}; expected a mapping name ({sample}) or key prefix")
        if op not in ops:
            raise InputError(estimates.file, f"row {row}.op", f"unknown op {op!r}; expected an op of {graph.name}")
