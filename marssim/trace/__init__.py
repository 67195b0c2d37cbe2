"""Views of a simulation's interval log: Chrome/Perfetto traces, Parquet/CSV tables, figures.

* :func:`write_chrome_trace` — Chrome Trace Event JSON (``.json`` or ``.json.gz``), streaming;
* :func:`export_intervals` / :func:`import_intervals` — the interval log as Parquet or CSV with
  unit-suffixed columns, exact round trip;
* :func:`plot_result` — Gantt chart, utilisation and memory figures (PNG and SVG).

Everything here reads a :class:`~marssim.sim.Result` only (a fresh one or one loaded with
``Result.load``), never how it was produced.
"""

from __future__ import annotations

from .chrome import chrome_events, write_chrome_trace
from .columnar import export_intervals, import_intervals, intervals_table
from .lanes import assign_lanes
from .layout import TraceLayout, build_layout

__all__ = ["write_chrome_trace", "chrome_events", "export_intervals", "import_intervals", "intervals_table",
           "plot_result", "assign_lanes", "build_layout", "TraceLayout"]


def plot_result(result, png_path, **options) -> list:
    """Write the figures of ``result`` (see :func:`marssim.trace.figures.plot_result`)."""
    from .figures import plot_result as _plot

    return _plot(result, png_path, **options)
