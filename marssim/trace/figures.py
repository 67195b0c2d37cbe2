"""Figures of a simulation result with matplotlib (Agg, no display needed), as PNG and SVG.

* :func:`gantt_figure` — devices and links over time: one row per accelerator (its compute) and
  per busy link, concurrent work on extra lanes of a row; coloured by layer (graph order, a
  colour bar with layer names when there are many) or by model (a legend);
* :func:`utilisation_figure` — compute utilisation per device and bandwidth utilisation per link;
* :func:`memory_figure` — memory occupancy over time per device, with its capacity.

:func:`plot_result` writes all three next to each other: ``out.png`` (the Gantt chart),
``out-utilisation.png``, ``out-memory.png``, each also as ``.svg``.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd

from marssim.errors import InputError
from marssim.fsutil import atomic_file
from marssim.units import fmt_bytes, fmt_rate

from .layout import build_layout

__all__ = ["plot_result", "gantt_figure", "utilisation_figure", "memory_figure", "COLOR_BY"]

COLOR_BY = ("auto", "layer", "model")
_LEGEND_MAX = 12  # more categories than this: a colour bar instead of a legend
_IDLE = "#d0d0d0"
_VECTOR_BARS = 20_000  # more intervals than this: the Gantt chart's bars rasterised in an SVG


def plot_result(result, png_path: str | Path, *, color_by: str = "auto", max_links: int = 24,
                formats: tuple[str, ...] = ("png", "svg"), dpi: int = 150,
                progress: Callable[[str], None] | None = None) -> list[Path]:
    """Write the Gantt chart to ``png_path`` and the utilisation and memory figures beside it
    (``<stem>-utilisation``, ``<stem>-memory``), each in every format of ``formats``, atomically.
    Returns the written paths. ``color_by``: ``layer``, ``model`` or ``auto`` (model when the
    result holds several models, else layer). ``max_links``: the busiest links shown.
    ``progress``: called with each figure's name before it is drawn and each file's before it
    is written."""
    png_path = Path(png_path)
    if not png_path.name.endswith(".png"):
        raise InputError(str(png_path), "--plot", "expected a file name ending in .png")
    if color_by not in COLOR_BY:
        raise InputError(None, "--color-by", f"expected one of {', '.join(COLOR_BY)}, got {color_by!r}")
    stem = png_path.with_suffix("")
    tell = progress or (lambda name: None)
    figures = [(stem, lambda: gantt_figure(result, color_by=color_by, max_links=max_links)),
               (stem.with_name(stem.name + "-utilisation"), lambda: utilisation_figure(result, max_links=max_links)),
               (stem.with_name(stem.name + "-memory"), lambda: memory_figure(result))]
    written = []
    for base, draw in figures:
        tell(f"{base.name}: drawing")
        fig = draw()
        for fmt in formats:
            path = base.with_name(base.name + "." + fmt)
            tell(path.name)
            _save(fig, path, fmt, dpi)
            written.append(path)
    return written


def _save(fig, path: Path, fmt: str, dpi: int) -> None:
    import matplotlib

    buf = io.BytesIO()
    metadata = {"Date": None} if fmt == "svg" else {}
    with matplotlib.rc_context({"svg.hashsalt": "marssim", "svg.fonttype": "none"}):
        fig.savefig(buf, format=fmt, dpi=dpi, metadata=metadata)
    with atomic_file(path, "wb") as handle:
        handle.write(buf.getvalue())


# ---------------------------------------------------------------------- helpers
def _new_figure(width: float, height: float):
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _time_unit(makespan: float) -> tuple[float, str]:
    """(factor from seconds, unit name) that keeps the time axis in readable numbers."""
    if makespan >= 1.0:
        return 1.0, "s"
    if makespan >= 1e-3:
        return 1e3, "ms"
    if makespan >= 1e-6:
        return 1e6, "µs"
    return 1e9, "ns"


def _title(result, what: str) -> str:
    meta = result.meta or {}
    parts = [str(meta[k]) for k in ("workload", "system") if meta.get(k)]
    head = " on ".join(parts)
    return f"{what}: {head}" if head else what


def _ordered_ops(result) -> list[str]:
    """Op names in graph order (the op table's), then any other op names of the log."""
    names = [str(x) for x in result.ops.index] if result.ops is not None and len(result.ops) else []
    seen = set(names)
    for op in pd.unique(result.intervals["op"]) if len(result.intervals) else []:
        op = str(op)
        if op and op not in seen:
            names.append(op)
            seen.add(op)
    return names


def _colouring(result, color_by: str):
    """(RGBA per interval row as an ``(n, 4)`` array, legend handles or None, (cmap, norm, tick
    positions, labels) or None, what the colours say). Vectorised: a folded run's timeline has
    hundreds of thousands of intervals."""
    from matplotlib import colormaps
    from matplotlib.colors import Normalize, to_rgba
    from matplotlib.patches import Patch

    iv = result.intervals
    idle = np.asarray(to_rgba(_IDLE), dtype=float)
    models = [m for m in pd.unique(iv["model"]) if m] if len(iv) else []
    if color_by == "auto":
        color_by = "model" if len(models) > 1 else "layer"

    def paint(codes: np.ndarray, palette: np.ndarray) -> np.ndarray:
        out = np.tile(idle, (len(codes), 1))
        known = codes >= 0
        out[known] = palette[codes[known]]
        return out

    if color_by == "model":
        cmap = colormaps["tab10"] if len(models) <= 10 else colormaps["tab20"]
        palette = np.asarray([cmap(i % cmap.N) for i in range(len(models))], dtype=float).reshape(-1, 4)
        codes = iv["model"].map({m: i for i, m in enumerate(models)}).fillna(-1).to_numpy(dtype=np.int64) \
            if len(iv) else np.zeros(0, dtype=np.int64)
        handles = [Patch(color=tuple(palette[i]), label=m) for i, m in enumerate(models)]
        return paint(codes, palette), handles, None, "model"
    ops = _ordered_ops(result)
    index = {op: i for i, op in enumerate(ops)}
    layer = iv["op"].astype(str).map(index).fillna(-1).to_numpy(dtype=np.int64) if len(iv) \
        else np.zeros(0, dtype=np.int64)
    if len(ops) <= _LEGEND_MAX:
        cmap = colormaps["tab20"] if len(ops) > 10 else colormaps["tab10"]
        palette = np.asarray([cmap(i % cmap.N) for i in range(len(ops))], dtype=float).reshape(-1, 4)
        handles = [Patch(color=tuple(palette[i]), label=op) for i, op in enumerate(ops)]
        return paint(layer, palette), handles, None, "layer"
    cmap = colormaps["turbo"]
    norm = Normalize(vmin=0, vmax=max(len(ops) - 1, 1))
    colours = np.asarray(cmap(norm(layer.astype(float))), dtype=float).reshape(-1, 4)
    colours[layer < 0] = idle
    ticks = np.unique(np.linspace(0, len(ops) - 1, 7).round().astype(int))
    return colours, None, (cmap, norm, ticks, [ops[t] for t in ticks]), "layer"


# ---------------------------------------------------------------------- Gantt
def gantt_figure(result, *, color_by: str = "auto", max_links: int = 24):
    """Devices and links over time, one row each (busiest ``max_links`` links)."""
    from matplotlib.cm import ScalarMappable

    layout = build_layout(result)
    iv = result.intervals
    scale, unit = _time_unit(result.makespan)
    colours, handles, bar, what = _colouring(result, color_by)
    start = iv["start"].to_numpy(dtype=float) * scale if len(iv) else np.zeros(0)
    dur = (iv["end"].to_numpy(dtype=float) - iv["start"].to_numpy(dtype=float)) * scale if len(iv) else np.zeros(0)

    # rows: each accelerator (compute lanes), then the busiest links (their flow lanes)
    n_lanes: dict[tuple[int, str], int] = {}
    for t in layout.threads:
        n_lanes[(t.pid, t.role)] = max(n_lanes.get((t.pid, t.role), 0), t.lane + 1)
    rows: list[tuple[str, int, str]] = []  # (label, pid, role)
    labelled = "label" in getattr(result.devices, "columns", ())
    for p in layout.processes:
        if p.kind == "accelerator":
            rows.append((p.name if labelled else p.key, p.pid, "compute"))
    link_procs = [p for p in layout.processes if p.kind in ("link", "switch")]
    column = next((c for c in ("utilisation", "bytes") if c in getattr(result.links, "columns", ())), None)
    busy = result.links[column] if column else pd.Series(dtype=float)
    ranked = sorted(link_procs, key=lambda p: -float(busy.get(p.key, 0.0)))[:max_links]  # stable on ties
    keep = {p.pid for p in ranked}
    link_rows = [(p.key, p.pid, "flow") for p in link_procs if p.pid in keep]
    rows += link_rows
    row_of = {(pid, role): k for k, (_, pid, role) in enumerate(rows)}

    height = max(2.8, 0.6 + 0.28 * len(rows))
    fig = _new_figure(11, height)
    ax = fig.subplots()
    # row and lane of each thread; bars are the compute intervals and the link slices
    n_tid = max((t.tid for t in layout.threads), default=0) + 1
    t_row = np.full(n_tid, -1, dtype=np.int64)
    t_lane = np.zeros(n_tid, dtype=np.int64)
    t_lanes = np.ones(n_tid, dtype=np.int64)
    for t in layout.threads:
        k = row_of.get((t.pid, t.role))
        if k is not None:
            t_row[t.tid], t_lane[t.tid], t_lanes[t.tid] = k, t.lane, n_lanes[(t.pid, t.role)]
    rgba = colours
    # past this many bars an SVG draws them as one embedded image (the axes, labels and text stay
    # vectors): a folded run's hundreds of thousands of bars would make a file of tens of MB
    raster = len(iv) > _VECTOR_BARS
    compute_rows = np.flatnonzero(iv["kind"].to_numpy(dtype=object) == "compute") if len(iv) else np.zeros(0, int)
    bar_row = np.r_[compute_rows, layout.hop_row].astype(np.int64)
    bar_tid = np.r_[layout.tid[compute_rows], layout.hop_tid].astype(np.int64)
    shown = t_row[bar_tid] >= 0
    bar_row, bar_tid = bar_row[shown], bar_tid[shown]
    order = np.lexsort((start[bar_row], t_lane[bar_tid], t_row[bar_tid]))
    bar_row, bar_tid = bar_row[order], bar_tid[order]
    key = t_row[bar_tid] * (int(t_lanes.max()) + 1) + t_lane[bar_tid]
    cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
    if raster and bar_row.shape[0]:  # one collection of every bar, its corners computed as arrays
        from matplotlib.collections import PolyCollection

        h = 0.8 / t_lanes[bar_tid]
        y0 = t_row[bar_tid] - 0.4 + t_lane[bar_tid] * h
        y1 = y0 + h * 0.92
        x0 = start[bar_row]
        x1 = x0 + dur[bar_row]
        verts = np.stack([np.c_[x0, y0], np.c_[x0, y1], np.c_[x1, y1], np.c_[x1, y0]], axis=1)
        ax.add_collection(PolyCollection(verts, facecolors=rgba[bar_row], edgecolors=rgba[bar_row], linewidth=0.3,
                                         rasterized=True), autolim=False)
        cuts = np.zeros(0, dtype=np.int64)
        bar_row = bar_row[:0]
    for chunk in np.split(np.arange(bar_row.shape[0]), cuts) if bar_row.shape[0] else []:
        rows_i = bar_row[chunk]
        tid0 = bar_tid[chunk[0]]
        h = 0.8 / t_lanes[tid0]
        y = t_row[tid0] - 0.4 + t_lane[tid0] * h
        # a thin edge in the bar's colour keeps nanosecond-long tasks visible at a glance
        ax.broken_barh(np.c_[start[rows_i], dur[rows_i]], (y, h * 0.92), facecolors=rgba[rows_i],
                       edgecolors=rgba[rows_i], linewidth=0.3, rasterized=raster)
    ax.set_yticks(range(len(rows)), [label for label, _, _ in rows], fontsize=8 if len(rows) < 40 else 6)
    ax.set_ylim(len(rows) - 0.5, -0.5)
    if link_rows and len(rows) > len(link_rows):
        ax.axhline(len(rows) - len(link_rows) - 0.5, color="0.3", linewidth=0.8)
    ax.set_xlim(0, result.makespan * scale if result.makespan > 0 else 1)
    ax.set_xlabel(f"time ({unit})")
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    n_links = len(link_procs)
    shown = f"; {len(link_rows)} busiest of {n_links} links" if n_links > len(link_rows) else ""
    ax.set_title(f"{_title(result, 'Timeline')}\nmakespan {result.makespan * scale:.4g} {unit}; "
                 f"accelerators (compute) above the line, links (transfers) below{shown}", fontsize=10)
    if handles is not None:
        ax.legend(handles=handles, title=what, fontsize=7, title_fontsize=8, loc="upper left",
                  bbox_to_anchor=(1.01, 1.0), frameon=False)
    elif bar is not None:
        cmap, norm, ticks, labels = bar
        cb = fig.colorbar(ScalarMappable(norm=norm, cmap=cmap), ax=ax, pad=0.01, fraction=0.03)
        cb.set_ticks(ticks, labels=labels, fontsize=7)
        cb.set_label("layer (graph order)", fontsize=8)
    if not len(iv):
        ax.text(0.5, 0.5, "no intervals", transform=ax.transAxes, ha="center")
    return fig


# ---------------------------------------------------------------------- utilisation
def utilisation_figure(result, *, max_links: int = 24):
    """Compute utilisation per accelerator and bandwidth utilisation per link, in percent."""
    devices = result.devices
    links = result.links
    used = links[(links["bytes"] > 0) & (links["kind"] != "memory")] if len(links) and "kind" in links.columns \
        else links.iloc[0:0]
    top = used.sort_values("utilisation", ascending=False, kind="stable").head(max_links)
    top = top.loc[[r for r in used.index if r in set(top.index)]]
    n_rows = max(len(devices), len(top), 1)
    fig = _new_figure(11, max(3.0, 1.0 + 0.24 * n_rows))
    ax_d, ax_l = fig.subplots(1, 2)
    scale, unit = _time_unit(result.makespan)
    names = [f"{d} ({lab})" if lab else str(d) for d, lab in
             zip(devices.index, devices["label"] if "label" in devices.columns else [""] * len(devices))]
    _hbars(ax_d, names, 100 * devices["utilisation"].to_numpy(dtype=float) if len(devices) else [],
           "#3b75af", [str(d) for d in devices.get("design", pd.Series(dtype=str)).tolist()])
    ax_d.set_title("accelerators: busy computing", fontsize=10)
    caps = [fmt_rate(float(c)) for c in top["capacity"]] if len(top) else []
    _hbars(ax_l, list(top.index), 100 * top["utilisation"].to_numpy(dtype=float) if len(top) else [], "#d9822b", caps)
    more = f" ({len(top)} busiest of {len(used)})" if len(used) > len(top) else ""
    ax_l.set_title(f"links: bytes / (capacity x makespan){more}", fontsize=10)
    fig.suptitle(f"{_title(result, 'Utilisation')} (makespan {result.makespan * scale:.4g} {unit})", fontsize=11)
    return fig


def _hbars(ax, labels, values, colour, notes) -> None:
    y = np.arange(len(labels))
    values = np.asarray(values, dtype=float)
    ax.barh(y, values, color=colour, height=0.7)
    ax.set_yticks(y, labels, fontsize=8 if len(labels) < 40 else 6)
    ax.set_ylim(len(labels) - 0.5, -0.5) if len(labels) else ax.set_ylim(0, 1)
    ax.set_xlim(0, 115)
    ax.set_xlabel("utilisation (%)")
    ax.grid(axis="x", color="0.9", linewidth=0.6)
    ax.set_axisbelow(True)
    for yi, v, note in zip(y, values, notes or [""] * len(labels)):
        text = f"{v:.1f}%" + (f"  {note}" if note and note != "nan" else "")
        ax.text(min(v, 100) + 1, yi, text, va="center", fontsize=7)
    if not len(labels):
        ax.text(0.5, 0.5, "nothing to show", transform=ax.transAxes, ha="center")


# ---------------------------------------------------------------------- memory
def memory_figure(result, *, max_overlaid: int = 8):
    """Memory occupancy over time per node (accelerators, then hosts), with capacities: one
    plot with a line per node for up to ``max_overlaid`` nodes, else one small panel per node
    on shared axes (identical devices would hide each other's lines in one plot)."""
    from matplotlib import colormaps

    stages = (result.meta.get("parallel_report") or {}).get("stages")
    if stages:
        return _memory_by_term(result, stages)
    mem = result.memory_timeline
    scale, unit = _time_unit(result.makespan)
    if mem is None or not len(mem):
        fig = _new_figure(11, 3.0)
        ax = fig.subplots()
        ax.text(0.5, 0.5, "no memory timeline recorded (simulate with record=True)", transform=ax.transAxes,
                ha="center")
        ax.set_title(_title(result, "Memory"), fontsize=10)
        return fig
    caps = result.memories["capacity_bytes"] if "capacity_bytes" in result.memories.columns else pd.Series(dtype=float)
    present = {str(n) for n in mem["node"].unique()}
    accelerators = [str(d) for d in result.devices.index if str(d) in present]
    nodes = accelerators + sorted(present - set(accelerators))
    groups = {str(k): g for k, g in mem.groupby("node", sort=False)}
    peaks = mem.groupby("node")["bytes"].max()
    peak = float(peaks.max())
    byte_unit, byte_div = _byte_unit(peak)
    end = result.makespan * scale if result.makespan > 0 else 1.0
    top = max(peak / byte_div * 1.15, 1e-12)

    def series(node):
        grp = groups[node]
        t = np.r_[grp["time"].to_numpy(dtype=float) * scale, end]
        v = np.r_[grp["bytes"].to_numpy(dtype=float), grp["bytes"].iloc[-1]] / byte_div
        return t, v

    off_scale: dict[str, list[str]] = {}
    drawn: set = set()

    def capacity(ax, node, label: bool) -> None:
        if node not in caps.index:
            return
        cap = float(caps[node])
        if cap / byte_div <= 1.5 * peak / byte_div:
            if (id(ax), cap) in drawn:
                return
            drawn.add((id(ax), cap))
            ax.axhline(cap / byte_div, color="crimson", linestyle="--", linewidth=1)
            if label:
                ax.text(end, cap / byte_div, f"capacity {fmt_bytes(cap)} ", color="crimson", va="bottom",
                        ha="right", fontsize=7)
        else:
            off_scale.setdefault(fmt_bytes(cap), []).append(node)

    if len(nodes) <= max_overlaid:
        fig = _new_figure(11, 4.2)
        ax = fig.subplots()
        cmap = colormaps["tab10"]
        for k, node in enumerate(nodes):
            t, v = series(node)
            ax.step(t, v, where="post", color=cmap(k % cmap.N), linewidth=1.2, label=node)
            capacity(ax, node, label=True)
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
        axes = [ax]
    else:
        ncols = 4
        nrows = -(-len(nodes) // ncols)
        fig = _new_figure(11, 0.6 + 1.25 * nrows)
        grid = fig.subplots(nrows, ncols, sharex=True, sharey=True, squeeze=False)
        axes = list(grid.ravel())
        for ax, node in zip(axes, nodes):
            t, v = series(node)
            ax.step(t, v, where="post", color="#3b75af", linewidth=0.9)
            ax.fill_between(t, v, step="post", color="#3b75af", alpha=0.15, linewidth=0)
            capacity(ax, node, label=False)
            ax.set_title(f"{node}  (peak {fmt_bytes(float(peaks[node]))})", fontsize=8, pad=2)
            ax.tick_params(labelsize=7)
        for ax in axes[len(nodes):]:
            ax.set_visible(False)
        for ax in grid[:, 0]:
            ax.set_ylabel(byte_unit, fontsize=8)
        for col in range(ncols):  # time labels under the lowest panel of each column
            last = grid[(len(nodes) - 1 - col) // ncols, col] if col < len(nodes) else None
            if last is not None:
                last.xaxis.set_tick_params(labelbottom=True)
                last.set_xlabel(f"time ({unit})", fontsize=8)
    for ax in axes:
        ax.set_ylim(0, top)
        ax.set_xlim(0, end)
        ax.grid(color="0.92", linewidth=0.6)
    if len(axes) == 1:
        axes[0].set_xlabel(f"time ({unit})")
        axes[0].set_ylabel(f"occupancy ({byte_unit})")
    subtitle = f"weights + live buffers; peak {fmt_bytes(peak)} on {peaks.idxmax()}"
    if off_scale:
        parts = [f"{cap} ({_node_list(names)})" for cap, names in off_scale.items()]
        subtitle += f"\ncapacity off the scale: {'; '.join(parts)}"
    title = f"{_title(result, 'Memory occupancy')}\n{subtitle}"
    if len(axes) == 1:
        axes[0].set_title(title, fontsize=10)
    else:
        fig.suptitle(title, fontsize=10)
    return fig


_TERM_COLOURS = {"weights": "#3b75af", "gradients": "#7fa7d1", "optimizer state": "#c0d4ea", "activations": "#d9822b",
                 "KV cache": "#5c9e4a", "communication buffers": "#8c6bb1"}


def _memory_by_term(result, stages: list[dict]):
    """Memory per GPU of each pipeline stage, stacked by term (weights, gradients, optimizer
    state, activations, KV cache, communication buffers; the closed form a parallel run reports),
    against the GPU's capacity."""
    report = result.meta["parallel_report"]
    terms = [t for t in _TERM_COLOURS if any(s["memory_bytes"].get(t, 0) > 0 for s in stages)]
    peak = max(sum(s["memory_bytes"].values()) for s in stages)
    capacity = float(report.get("memory_capacity_bytes") or 0.0)
    top = max(peak, capacity) * 1.12
    unit, div = _byte_unit(top)
    fig = _new_figure(11, max(3.2, 1.2 + 0.32 * len(stages)))
    ax = fig.subplots()
    y = np.arange(len(stages))
    left = np.zeros(len(stages))
    for term in terms:
        values = np.asarray([s["memory_bytes"].get(term, 0.0) for s in stages]) / div
        ax.barh(y, values, left=left, color=_TERM_COLOURS[term], height=0.7, label=term)
        left += values
    for yi, total in zip(y, left):
        ax.text(total, yi, f" {total:.2f} {unit}", va="center", fontsize=7)
    if capacity:
        ax.axvline(capacity / div, color="crimson", linestyle="--", linewidth=1)
        ax.text(capacity / div, -0.6, f"capacity {fmt_bytes(capacity)}", color="crimson", ha="right", fontsize=7)
    ax.set_yticks(y, [f"stage {s['stage']} ({s['gpus']} GPUs)" for s in stages], fontsize=8 if len(stages) < 40 else 6)
    ax.set_ylim(len(stages) - 0.5, -0.9)
    ax.set_xlim(0, top / div)
    ax.set_xlabel(f"memory per GPU ({unit})")
    ax.grid(axis="x", color="0.92", linewidth=0.6)
    ax.set_axisbelow(True)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)
    ax.set_title(f"{_title(result, 'Memory per GPU by term')}\npeak {fmt_bytes(peak)} (the closed form the "
                 "pre-check and the search use)", fontsize=10)
    return fig


def _node_list(names: list[str]) -> str:
    return ", ".join(names) if len(names) <= 3 else f"{names[0]} ... {names[-1]}, {len(names)} nodes"


def _byte_unit(peak: float) -> tuple[str, float]:
    for name, div in (("GiB", 2.0**30), ("MiB", 2.0**20), ("KiB", 2.0**10)):
        if peak >= div:
            return name, div
    return "bytes", 1.0
