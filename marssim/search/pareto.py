"""Pareto fronts of a serving search: the simulated deployments no other simulated deployment
beats on two figures at once, as a capacity planner chooses among them.

Two fronts, each over the deployments whose *simulation* meets the constraints (a deployment
only screened never appears: the closed form's tail latencies are its weakest part):

* **throughput against interactivity**: output tokens/s per GPU (the operator's figure) against
  tokens/s per user (the mean over requests of their tokens after the first over their decoding
  time, 1 / TPOT: what a user sees), both maximised;
* **GPUs against rate**: GPUs (minimised) against the rate served within the constraints, in
  requests/s (the goodput for ``--objective goodput``, else the offered load every point serves).

:func:`front_table` makes the table (one row per point, ``on_*_front`` saying which front it is
on), :func:`plot_fronts` the figure, :func:`screen_front` the screened deployments the screen
puts on the first front (which the search then simulates, within its budget)."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

__all__ = ["Sense", "FRONTS", "non_dominated", "dominates", "front_points", "front_table", "format_front",
           "plot_fronts", "screen_front", "FrontPoint"]

T = TypeVar("T")
Sense = tuple[str, str]
"""An axis of a front: the figure's column name and ``"max"`` or ``"min"``."""

FRONTS: dict[str, tuple[Sense, Sense]] = {
    "tokens": (("user_tokens_per_s", "max"), ("output_tokens_per_s_per_gpu", "max")),
    "gpus": (("gpus", "min"), ("rate_rps", "max")),
}
"""The two fronts: (x axis, y axis) of each."""


def dominates(a: Sequence[float], b: Sequence[float], senses: Sequence[str]) -> bool:
    """Whether ``a`` is at least as good as ``b`` on every figure and better on one (``senses``:
    ``"max"`` or ``"min"`` per figure; NaN is never good)."""
    better = False
    for x, y, sense in zip(a, b, senses):
        if x != x:
            return False
        if y != y:
            better = True
            continue
        if sense == "min":
            x, y = -x, -y
        if x < y:
            return False
        if x > y:
            better = True
    return better


def non_dominated(items: Sequence[T], figures: Callable[[T], Sequence[float]], senses: Sequence[str]) -> list[int]:
    """Indices of the items no other item dominates (:func:`dominates`), in the items' order; items
    with equal figures are all kept. Sorting by the first figure then sweeping the second: O(n log n)
    for two figures, a pairwise check for more."""
    values = [tuple(float(v) for v in figures(it)) for it in items]
    if len(senses) != 2:
        return [i for i, v in enumerate(values)
                if not any(dominates(w, v, senses) for j, w in enumerate(values) if j != i)]
    sign = [1.0 if s == "max" else -1.0 for s in senses]
    keyed = [(sign[0] * v[0], sign[1] * v[1], i) for i, v in enumerate(values) if v[0] == v[0] and v[1] == v[1]]
    # best first on the first figure, then the second: a point is on the front when its second
    # figure beats every point before it that is strictly better on the first one
    keyed.sort(key=lambda t: (-t[0], -t[1]))
    out: list[int] = []
    best_before = -math.inf  # best second figure among points strictly better on the first
    group_start = 0
    while group_start < len(keyed):
        group_end = group_start
        while group_end < len(keyed) and keyed[group_end][0] == keyed[group_start][0]:
            group_end += 1
        top = keyed[group_start][1]  # the group's best second figure
        if top > best_before:
            out += [t[2] for t in keyed[group_start:group_end] if t[1] == top]
        best_before = max(best_before, top)
        group_start = group_end
    return sorted(out)


@dataclass(frozen=True)
class FrontPoint:
    """A simulated deployment meeting the constraints, as the fronts read it: the deployment, its
    short text, GPUs, output tokens/s in all and per GPU, tokens/s per user, the rate it serves
    within the constraints (requests/s), TTFT and TPOT P99 (s)."""

    plan: object
    short: str
    gpus: int
    output_tokens_per_s: float
    output_tokens_per_s_per_gpu: float
    user_tokens_per_s: float
    rate_rps: float
    ttft_p99_s: float
    tpot_p99_s: float


def front_points(candidates: Sequence, objective: str) -> list[FrontPoint]:
    """The candidates (:class:`~marssim.search.result.Candidate`) whose simulation meets the
    constraints, as front points, one per deployment (a screen never counts)."""
    from marssim.plan import plan_key

    from .report import short_deployment

    seen: set = set()
    out = []
    for c in candidates:
        e = c.simulated
        if e is None or not e.feasible or not e.slo_met or e.gpus <= 0:
            continue
        k = plan_key(c.plan)
        if k in seen:
            continue
        seen.add(k)
        rate = e.goodput if objective == "goodput" else e.rate
        out.append(FrontPoint(c.plan, short_deployment(c.plan), int(e.gpus), float(e.throughput),
                              float(e.throughput) / e.gpus, float(e.user_tokens_per_s), float(rate),
                              float(e.latency.get("ttft_p99", math.nan)), float(e.latency.get("tpot_p99", math.nan))))
    return out


def _figures(name: str) -> Callable[[FrontPoint], tuple[float, float]]:
    (xa, _), (ya, _) = FRONTS[name]
    return lambda p: (getattr(p, xa), getattr(p, ya))


def front_table(points: Sequence[FrontPoint]):
    """One row per point (pandas DataFrame): deployment, short text, source (always
    ``simulated``), GPUs, output tokens/s and per GPU, tokens/s per user, rate (requests/s), TTFT
    and TPOT P99 (ms), and whether it is on each front (``on_tokens_front``, ``on_gpus_front``);
    points on the first front first, by tokens/s per user."""
    import pandas as pd

    on = {name: set(non_dominated(points, _figures(name), [s for _, s in axes])) for name, axes in FRONTS.items()}
    rows = []
    for i, p in enumerate(points):
        rows.append({"deployment": p.plan.text(), "short": p.short, "source": "simulated", "gpus": p.gpus,
                     "output_tokens_per_s": p.output_tokens_per_s,
                     "output_tokens_per_s_per_gpu": p.output_tokens_per_s_per_gpu,
                     "user_tokens_per_s": p.user_tokens_per_s, "rate_rps": p.rate_rps,
                     "ttft_p99_ms": p.ttft_p99_s * 1e3, "tpot_p99_ms": p.tpot_p99_s * 1e3,
                     "on_tokens_front": i in on["tokens"], "on_gpus_front": i in on["gpus"]})
    columns = ["deployment", "short", "source", "gpus", "output_tokens_per_s", "output_tokens_per_s_per_gpu",
               "user_tokens_per_s", "rate_rps", "ttft_p99_ms", "tpot_p99_ms", "on_tokens_front", "on_gpus_front"]
    table = pd.DataFrame(rows, columns=columns)
    if len(table):
        table = table.sort_values(["on_tokens_front", "user_tokens_per_s", "short"], ascending=[False, True, True],
                                  kind="stable").reset_index(drop=True)
    return table


def format_front(table, rate_label: str = "req/s", width: int = 120) -> str:
    """The first front's points as aligned text (by tokens/s per user), within ``width`` columns
    where the deployments allow it (the deployment column widens to the longest, never cut)."""
    front = table[table["on_tokens_front"]]
    if not len(front):
        return "(no simulated deployment meets the constraints)"
    col = max([50, *(len(str(x)) + 1 for x in front["short"])])  # widened to the longest, never cut
    lines = [f"{'deployment':<{col}}{'GPUs':>6}{'tok/s/GPU':>11}{'tok/s/user':>11}{rate_label:>9}{'TTFT P99':>10}"
             f"{'TPOT P99':>10}{'GPU front':>10}",
             f"{'':<{col + 17}}{'':>11}{'':>9}{'ms':>10}{'ms':>10}"]
    for r in front.itertuples():
        lines.append((f"{r.short:<{col}}{r.gpus:>6d}{r.output_tokens_per_s_per_gpu:>11.4g}{r.user_tokens_per_s:>11.4g}"
                      f"{r.rate_rps:>9.4g}{r.ttft_p99_ms:>10.1f}{r.tpot_p99_ms:>10.2f}"
                      f"{'yes' if r.on_gpus_front else '':>10}").rstrip())
    return "\n".join(lines)


def plot_fronts(table, png: str | Path, title: str, rate_label: str = "requests/s within the constraints"
                ) -> list[Path]:
    """The two fronts side by side (PNG and SVG): every point a simulated deployment meeting the
    constraints, those on the front annotated with their short text and joined by the front's
    step line, dominated ones grey and unnamed (the front's table names every point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from .report import save_figure

    fig, axes = plt.subplots(1, 2, figsize=(15.0, 6.5))
    panels = (("tokens", "throughput against interactivity", "tokens/s per user (1 / TPOT, mean over requests)",
               "output tokens/s per GPU", "pre"),
              ("gpus", "GPUs against rate", "GPUs", rate_label, "post"))
    for ax, (name, heading, xlabel, ylabel, where) in zip(axes, panels):
        (xa, _), (ya, _) = FRONTS[name]
        flag = f"on_{name}_front"
        off = table[~table[flag]]
        on = table[table[flag]].sort_values([xa, ya])
        ax.scatter(off[xa], off[ya], s=30, color="0.72", label=f"dominated ({len(off)})", zorder=2)
        ax.scatter(on[xa], on[ya], s=50, color="C0", edgecolor="black", linewidth=0.6,
                   label=f"on the front ({len(on)})", zorder=3)
        if len(on):
            ax.step(on[xa], on[ya], where=where, color="C0", linewidth=1.4, zorder=2, label="front")
        ax.margins(x=0.3, y=0.15 if name == "tokens" else 0.6)
        if name == "gpus":
            ax.xaxis.get_major_locator().set_params(integer=True)
        low, high = ax.get_xlim()
        # the front's points named (a dominated point is named in the table beside the figure: its
        # labels piled up where many deployments serve the same rate)
        labels = [group for group in _label_groups(table, xa, ya, flag) if group[2]]
        for k, (xy, names, front) in enumerate(labels):
            style = {"fontsize": 8, "color": "black", "zorder": 4}
            if name == "gpus":  # points in rows of a few GPUs apart: labels slanted, clear of each other
                ax.annotate(names, xy, textcoords="offset points", xytext=(4, 7), ha="left", va="bottom",
                            rotation=30, rotation_mode="anchor", **style)
                continue
            # a label extends away from the nearer side of the panel, alternately above and below
            right = (xy[0] - low) / (high - low) > 0.6 if high > low else False
            ax.annotate(names, xy, textcoords="offset points", xytext=(-7 if right else 7, 6 if k % 2 == 0 else -6),
                        ha="right" if right else "left", va="bottom" if k % 2 == 0 else "top", **style)
        ax.set_title(heading, fontsize=11)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.11), ncol=3, fontsize=8, frameon=False)
    fig.suptitle("\n".join(textwrap.wrap(title, 160)), fontsize=10)
    return save_figure(fig, png)


def _label_groups(table, xa: str, ya: str, flag: str, most: int = 3) -> list[tuple[tuple[float, float], str, bool]]:
    """Labels of the points, points at the same place (4 significant digits) as one label of
    their short texts (at most ``most``, then how many more); whether one of them is on the front;
    ordered by x."""
    groups: dict[tuple, list] = {}
    for r in table.itertuples():
        x, y = float(getattr(r, xa)), float(getattr(r, ya))
        if x != x or y != y:
            continue
        groups.setdefault((float(f"{x:.4g}"), float(f"{y:.4g}")), []).append((not getattr(r, flag), r.short, x, y))
    out = []
    for key in sorted(groups):
        members = sorted(groups[key])
        names = [m[1] for m in members]
        text = "\n".join(names[:most]) + (f"\n+{len(names) - most} more" if len(names) > most else "")
        out.append(((members[0][2], members[0][3]), text, not members[0][0]))
    return out


def screen_front(screened: Sequence[tuple[object, object]], slack: float) -> list[object]:
    """The deployments the screen puts on the throughput-interactivity front: of ``(deployment,
    screened Evaluation)`` pairs whose screen meets the constraints relaxed by ``slack``, those no
    other such deployment dominates on output tokens/s per GPU and tokens/s per user (the screen's
    1 / mean TPOT), in the pairs' order."""
    ok = [(d, e) for d, e in screened if e.feasible and e.gpus > 0 and e.slo_ratio <= slack]

    def figures(item):
        _, e = item
        tpot = e.latency.get("tpot_mean", math.nan)
        return (1.0 / tpot if tpot > 0 else math.nan, e.throughput / e.gpus)

    return [ok[i][0] for i in non_dominated(ok, figures, ("max", "max"))]
