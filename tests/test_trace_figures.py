"""Figures: files written as PNG and SVG, the right rows, colours and annotations."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import matplotlib.image
import numpy as np
import pytest

from marssim.errors import InputError
from marssim.lower import lower
from marssim.mapping import Mapping
from marssim.sim import simulate
from marssim.trace import build_layout, plot_result
from marssim.trace.figures import gantt_figure, memory_figure, utilisation_figure
from marssim.workload.graph import merge_graphs
from support import RooflineCost, make_system
from test_trace_chrome import CASES, small_cnn


def _bars(ax) -> int:
    return sum(len(c.get_paths()) for c in ax.collections)


def test_plot_result_writes_png_and_svg_of_three_figures(tmp_path):
    result = CASES["pipeline-oc"]()
    paths = plot_result(result, tmp_path / "run.png")
    names = sorted(p.name for p in paths)
    assert names == sorted(f"run{s}.{f}" for s in ("", "-utilisation", "-memory") for f in ("png", "svg"))
    for p in paths:
        if p.suffix == ".png":
            image = matplotlib.image.imread(p)
            assert image.ndim == 3 and image.shape[0] > 300 and image.shape[1] > 1000
        else:
            assert ET.parse(p).getroot().tag.endswith("svg")
    again = plot_result(result, tmp_path / "again.png")
    assert (tmp_path / "run.svg").read_bytes() == (tmp_path / "again.svg").read_bytes()
    assert len(again) == 6


def test_gantt_rows_are_devices_then_busiest_links_with_one_bar_per_slice():
    result = CASES["pipeline-oc"]()
    layout = build_layout(result)
    fig = gantt_figure(result, max_links=5)
    ax = fig.axes[0]
    labels = [t.get_text() for t in ax.get_yticklabels()]
    links = result.links[(result.links["bytes"] > 0) & (result.links["kind"] != "memory")]
    busiest = set(links.sort_values("utilisation", ascending=False, kind="stable").index[:5])
    assert labels[:4] == ["acc0", "acc1", "acc2", "acc3"]
    assert set(labels[4:]) == busiest and len(labels) == 9
    shown_pids = {layout.resource_pid[r] for r in busiest}
    n_compute = int((result.intervals["kind"] == "compute").sum())
    n_hops = int(np.isin(layout.hop_pid, list(shown_pids)).sum())
    assert _bars(ax) == n_compute + n_hops
    assert ax.get_xlabel() == "time (µs)" and "makespan" in ax.get_title()
    assert ax.get_xlim()[1] == pytest.approx(result.makespan * 1e6)


def test_few_layers_get_a_legend_many_layers_a_colour_bar():
    result = CASES["single-set-dp"]()
    fig = gantt_figure(result, color_by="layer")
    legend = fig.axes[0].get_legend()
    assert [t.get_text() for t in legend.get_texts()] == list(result.ops.index)
    assert len(fig.axes) == 1

    from marssim.workload.builder import GraphBuilder

    b = GraphBuilder("deep", batch=2)
    x = b.input("x", c=8, h=8, w=8)
    for i in range(30):
        x = b.eltwise(f"relu{i}", x, fn="relu")
    g = b.build()
    system = make_system(2, topology="chain")
    deep = simulate(lower(g, system, Mapping.single_set(g, system), RooflineCost()), system)
    fig = gantt_figure(deep, color_by="layer")
    assert fig.axes[0].get_legend() is None
    assert len(fig.axes) == 2  # the colour bar
    ticks = [t.get_text() for t in fig.axes[1].get_yticklabels()]
    assert ticks[0] == "relu0" and ticks[-1] == "relu29"


def test_colour_by_model_on_two_models():
    g = merge_graphs("pair", [small_cnn(model="alpha"), small_cnn(model="beta")])
    system = make_system(4, topology="ring")
    result = simulate(lower(g, system, Mapping.single_set(g, system), RooflineCost()), system)
    for color_by in ("model", "auto"):
        legend = gantt_figure(result, color_by=color_by).axes[0].get_legend()
        assert [t.get_text() for t in legend.get_texts()] == ["alpha", "beta"]


def test_utilisation_bars_match_the_result_tables():
    result = CASES["single-set-dp"]()
    fig = utilisation_figure(result)
    dev_ax, link_ax = fig.axes
    widths = [p.get_width() for p in dev_ax.patches]
    assert widths == pytest.approx((100 * result.devices["utilisation"]).tolist())
    used = result.links[(result.links["bytes"] > 0) & (result.links["kind"] != "memory")]
    assert sorted(t.get_text() for t in link_ax.get_yticklabels()) == sorted(used.index)
    assert dev_ax.get_xlabel() == "utilisation (%)"


def test_memory_shows_capacity_when_on_scale_and_says_so_when_not():
    spill = CASES["spill"]()  # 1 MiB memories, filled to the brim
    ax = memory_figure(spill).axes[0]
    caps = [l for l in ax.get_lines() if l.get_linestyle() == "--"]
    assert [c.get_ydata()[0] for c in caps] == [1024]  # 1 MiB, drawn once for both devices
    assert ax.get_ylabel() == "occupancy (KiB)"  # peak 700 KiB: the second buffer was spilled to the host
    roomy = CASES["single-set-dp"]()  # 16 GiB memories, a few KiB used
    fig = memory_figure(roomy)
    assert "capacity off the scale: 16 GiB" in fig.axes[0].get_title()
    many = CASES["pipeline-oc"]()
    fig = memory_figure(many, max_overlaid=2)  # one small panel per node
    assert len([a for a in fig.axes if a.get_visible()]) == many.memory_timeline["node"].nunique()


def test_bad_plot_arguments_are_input_errors(tmp_path):
    result = CASES["spill"]()
    with pytest.raises(InputError, match=".png"):
        plot_result(result, tmp_path / "x.jpg")
    with pytest.raises(InputError, match="--color-by"):
        plot_result(result, tmp_path / "x.png", color_by="rainbow")
    assert not list(tmp_path.iterdir())
