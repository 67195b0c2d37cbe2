"""The validation report: error statistics, rank correlation, contention attribution, a user's
estimates beside the simulation; text, CSV and the scatter plot."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .records import Comparison, UserEstimates, resolve_name

__all__ = ["ValidationReport", "scatter_plot"]


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
                user[resolve_name(ref, rows["mapping"].tolist(), by_key)] = value
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
        targets = [c for c in comparisons if c.name == resolve_name(ref, names, by_key)] if ref else comparisons
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
