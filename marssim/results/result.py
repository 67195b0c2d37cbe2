"""The outcome of an evaluation, simulated or estimated: makespan, per-resource summaries, the
full interval log and the per-op and per-layer report.

Units are SI (seconds, bytes, bytes/s, joules). The interval log has one row per compute or
transfer interval; traces and plots (``marssim.trace``) are views of it.

``intervals`` columns: ``kind`` (compute, transfer, spill_out, spill_in), ``resource`` (device
name for compute, ``src->dst`` for transfers), ``task`` (TaskGraph id, -1 for spills), ``op``,
``model``, ``micro_batch``, ``start``, ``end`` (s), ``bytes``, ``flops``, ``energy`` (J, NaN
unknown; a transfer's communication energy), ``src``, ``dst``, ``collective`` (kind or empty),
``collective_id`` (-1 none), ``links`` (resources the transfer held, ``;``-separated).

``memory_timeline``: ``node``, ``time`` (s), ``bytes`` (occupancy after the change, resident
weights included). ``link_timeline``: ``resource``, ``time`` (s), ``rate`` (bytes/s in use
after the change), ``flows`` (active flows).

``edges``: ``src_task``, ``dst_task``: the dependencies that involve a transfer (producer
compute -> transfer -> consumer compute, and transfer -> transfer inside collectives).
``ops``, ``layers``, ``op_devices``: the per-op and per-layer-group report and the busy time per
(op, device) (:mod:`marssim.results.report`), built when first read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from marssim.csvio import read_csv_exact
from marssim.fsutil import staged_dir
from marssim.lazymodule import lazy_module
from marssim.units import fmt_bytes, fmt_rate, fmt_time

pd = lazy_module("pandas")  # imported when a table is first built

__all__ = ["Result", "INTERVAL_COLUMNS"]

INTERVAL_COLUMNS = ("kind", "resource", "task", "op", "model", "micro_batch", "start", "end", "bytes", "flops",
                    "energy", "src", "dst", "collective", "collective_id", "links")

GZIP_ROWS = 100_000
"""Tables of more rows than this are saved gzip-compressed (``NAME.csv.gz``)."""
_GZIP = {"method": "gzip", "compresslevel": 1, "mtime": 0}  # fast, and the same bytes for the same table


def _table_file(directory: Path, file: str) -> Path | None:
    """``directory/file``, or its gzip-compressed form ``file.gz``; None when neither exists."""
    for path in (directory / file, directory / (file + ".gz")):
        if path.is_file():
            return path
    return None


_REPORT_FILES = {"ops": ("ops.csv", "op"), "layers": ("layers.csv", "group"), "op_devices": ("op_devices.csv", None)}


@dataclass
class Result:
    """An evaluation's result. ``devices``, ``links`` and ``memories`` are per-resource tables;
    ``ops``, ``layers`` and ``op_devices`` the report (see the module docstring), made by
    ``report`` when first read (a simulation builds them only if asked) or given."""

    makespan: float
    intervals: pd.DataFrame
    devices: pd.DataFrame  # index device: design, busy_s, utilisation, energy_j, flops, tasks
    links: pd.DataFrame  # index resource: kind, capacity, bytes, busy_s, utilisation
    memories: pd.DataFrame  # index node: peak_bytes, capacity_bytes, resident_bytes
    memory_timeline: pd.DataFrame
    link_timeline: pd.DataFrame
    edges: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=["src_task", "dst_task"]))
    throughput: float = float("nan")  # samples/s in steady state (pipelined runs), else batch/makespan
    setup_time: float = 0.0  # s to load weights from hosts before the run (not in the makespan)
    meta: dict[str, Any] = field(default_factory=dict)
    compute_energy: float = float("nan")  # J of compute tasks (NaN: no design has energy figures)
    communication_energy: float = float("nan")  # J of transfers (NaN: no link has an energy figure)
    report: Callable[[], dict[str, pd.DataFrame]] | None = field(default=None, repr=False)
    tables: dict[str, pd.DataFrame] = field(default_factory=dict, repr=False)

    # ------------------------------------------------------------------ report
    def _table(self, name: str) -> pd.DataFrame:
        if name not in self.tables:
            if self.report is None:
                return pd.DataFrame()
            self.tables.update(self.report())
            self.report = None  # built once; drop what it held (the TaskGraph, the times)
        return self.tables[name]

    @property
    def ops(self) -> pd.DataFrame:
        """One row per op, graph order (:data:`marssim.results.report.OP_COLUMNS`)."""
        return self._table("ops")

    @property
    def layers(self) -> pd.DataFrame:
        """One row per layer group (:data:`marssim.results.report.GROUP_COLUMNS`)."""
        return self._table("layers")

    @property
    def op_devices(self) -> pd.DataFrame:
        """Busy seconds per (op, device): ``op``, ``device``, ``busy_s``, ``tasks``."""
        return self._table("op_devices")

    # ------------------------------------------------------------------ views
    @property
    def energy(self) -> float:
        """Joules of the run: compute and communication energy, each where known (NaN when
        neither is)."""
        known = [e for e in (self.compute_energy, self.communication_energy) if e == e]
        return float(sum(known)) if known else float("nan")

    def bottlenecks(self, k: int = 3) -> tuple[list[str], list[str]]:
        """The ``k`` busiest devices and links (by utilisation)."""
        dev = self.devices.sort_values("utilisation", ascending=False).head(k).index.tolist()
        lk = self.links[self.links["bytes"] > 0].sort_values("utilisation", ascending=False).head(k).index.tolist()
        return dev, lk

    def summary(self) -> str:
        """A readable multi-line summary: makespan, throughput, bottlenecks, utilisation table."""
        lines = []
        title = " / ".join(str(self.meta[k]) for k in ("system", "workload", "mapping") if self.meta.get(k))
        if title:
            lines.append(title)
        how = " (analytical estimate: no link contention)" if self.meta.get("evaluator") == "analytical" else ""
        lines.append(f"makespan     {self.makespan * 1e3:.4f} ms{how}")
        if self.throughput == self.throughput:
            lines.append(f"throughput   {self.throughput:.4g} samples/s")
        if self.setup_time:
            lines.append(f"weight load  {fmt_time(self.setup_time)} (set-up, not in the makespan)")
        if self.energy == self.energy:
            parts = [f"{what} {e * 1e3:.4g} mJ" for what, e in (("compute", self.compute_energy),
                                                               ("communication", self.communication_energy)) if e == e]
            lines.append(f"energy       {self.energy * 1e3:.4g} mJ ({', '.join(parts)})")
        dev, lk = self.bottlenecks()
        if dev:
            lines.append("busiest devices: " + ", ".join(f"{d} ({self.devices.loc[d, 'utilisation']:.0%})" for d in dev))
        if lk:
            lines.append("busiest links:   " + ", ".join(f"{r} ({self.links.loc[r, 'utilisation']:.0%})" for r in lk))
        lines.append("")
        lines.append(f"{'device':<14}{'design':<14}{'busy':>12}{'util':>7}{'tasks':>7}{'mem peak':>12}{'capacity':>12}")
        for name, row in self.devices.iterrows():
            mem = self.memories.loc[name] if name in self.memories.index else None
            peak = fmt_bytes(mem["peak_bytes"]) if mem is not None else "-"
            cap = fmt_bytes(mem["capacity_bytes"]) if mem is not None else "-"
            lines.append(f"{name:<14}{str(row.get('design', '')):<14}{fmt_time(row['busy_s']):>12}"
                         f"{row['utilisation']:>7.0%}{int(row['tasks']):>7}{peak:>12}{cap:>12}")
        used = self.links[self.links["bytes"] > 0]
        if len(used):
            lines.append("")
            lines.append(f"{'link / resource':<28}{'bytes':>12}{'capacity':>14}{'util':>7}")
            for name, row in used.sort_values("utilisation", ascending=False).head(12).iterrows():
                lines.append(f"{name:<28}{fmt_bytes(row['bytes']):>12}{fmt_rate(row['capacity']):>14}"
                             f"{row['utilisation']:>7.0%}")
            if len(used) > 12:
                lines.append(f"... {len(used) - 12} more resources carried traffic")
        return "\n".join(lines)

    # ------------------------------------------------------------------ files
    def layers_by(self, level: str) -> pd.DataFrame:
        """The per-layer-group table with groups of ``level`` (``block`` or ``stage``, see
        :mod:`marssim.results.groups`), from the per-op table."""
        from .groups import layer_groups
        from .report import group_table

        pipeline = self.ops["set"].tolist() if self.meta.get("parallel") else None
        ops = self.ops.assign(group=layer_groups([str(n) for n in self.ops.index], level, pipeline))
        return group_table(ops, self.op_devices, self.makespan)

    def layer_report(self, *, per_op: bool = False, level: str | None = None, limit: int | None = None) -> str:
        """The per-layer table as text: one line per layer group (of ``level``, default the
        result's own) or with ``per_op`` per op, graph order, at most ``limit`` lines (see
        :func:`marssim.results.report.format_layers`)."""
        from .report import format_layers

        table = self.ops if per_op else (self.layers if level is None else self.layers_by(level))
        return "\n".join(format_layers(table, self.makespan, limit=limit, by="op" if per_op else "layer group"))

    def save(self, directory: str | Path, *, per_link: bool = False, progress: Callable[[str], None] | None = None
             ) -> Path:
        """Write ``summary.json`` and the tables as CSV into ``directory`` (atomically). A table
        of more than :data:`GZIP_ROWS` rows is written gzip-compressed (``intervals.csv.gz``:
        pandas and most tools read it as it is). ``per_link``: also ``link_timeline.csv``, every
        link's bandwidth in use over time (tens of MB on a cluster). ``progress``: called with
        the name of each table before it is written."""
        directory = Path(directory)
        tell = progress or (lambda name: None)

        def write(table, tmp: Path, name: str, **kwargs) -> None:
            tell(name)
            if len(table) > GZIP_ROWS:
                table.to_csv(tmp / f"{name}.csv.gz", compression=_GZIP, **kwargs)
            else:
                table.to_csv(tmp / f"{name}.csv", **kwargs)

        with staged_dir(directory) as tmp:
            summary = {"makespan_s": self.makespan, "throughput_samples_per_s": self.throughput,
                       "setup_time_s": self.setup_time, "energy_j": _json_number(self.energy),
                       "compute_energy_j": _json_number(self.compute_energy),
                       "communication_energy_j": _json_number(self.communication_energy),
                       "meta": _jsonable(self.meta)}
            (tmp / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
            write(self.intervals, tmp, "intervals", index=False)
            write(self.devices, tmp, "devices", index_label="device")
            write(self.links, tmp, "links", index_label="resource")
            write(self.memories, tmp, "memories", index_label="node")
            write(self.memory_timeline, tmp, "memory_timeline", index=False)
            if per_link:
                write(self.link_timeline, tmp, "link_timeline", index=False)
            write(self.edges, tmp, "edges", index=False)
            for name, (file, index) in _REPORT_FILES.items():
                table = self._table(name)
                write(table, tmp, file[:-len(".csv")], index=index is not None, index_label=index)
        return directory

    @classmethod
    def load(cls, directory: str | Path) -> "Result":
        """Read a result written by :meth:`save`. Raises InputError if files are missing."""
        from marssim.errors import InputError

        directory = Path(directory)
        if not (directory / "summary.json").is_file():
            raise InputError(str(directory), "summary.json", "missing; expected a directory written by `marssim "
                                                             "simulate --out`")
        for name in ("intervals", "devices", "links", "memories", "memory_timeline"):
            if _table_file(directory, name + ".csv") is None:
                raise InputError(str(directory), name + ".csv", "missing; expected a directory written by `marssim "
                                                                "simulate --out`")

        def table(file: str, **kwargs):
            return read_csv_exact(_table_file(directory, file), **kwargs)

        summary = json.loads((directory / "summary.json").read_text())
        intervals = table("intervals.csv", keep_default_na=False, na_values={"energy": ["", "nan", "NaN"]})
        for col in ("op", "model", "src", "dst", "collective", "links", "resource", "kind"):
            intervals[col] = intervals[col].astype(str)
        return cls(
            makespan=float(summary["makespan_s"]), intervals=intervals,
            devices=table("devices.csv", index_col="device"),
            links=table("links.csv", index_col="resource"),
            memories=table("memories.csv", index_col="node"),
            memory_timeline=table("memory_timeline.csv"),
            link_timeline=table("link_timeline.csv") if _table_file(directory, "link_timeline.csv") else
            pd.DataFrame({"resource": pd.Series(dtype=str), "time": pd.Series(dtype=float),
                          "rate": pd.Series(dtype=float), "flows": pd.Series(dtype=float)}),
            edges=table("edges.csv") if _table_file(directory, "edges.csv") else
            pd.DataFrame(columns=["src_task", "dst_task"]),
            throughput=float(summary.get("throughput_samples_per_s") or float("nan")),
            setup_time=float(summary.get("setup_time_s") or 0.0), meta=summary.get("meta", {}),
            compute_energy=_number(summary.get("compute_energy_j", summary.get("energy_j"))),
            communication_energy=_number(summary.get("communication_energy_j")),
            tables={name: _read_table(_table_file(directory, file), index) for name, (file, index) in
                    _REPORT_FILES.items() if _table_file(directory, file) is not None},
        )


def _jsonable(value: Any) -> Any:
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if value == value else None
    try:
        return float(value)
    except (TypeError, ValueError):
        return str(value)


def _json_number(x: float) -> float | None:
    return x if x == x else None


def _number(x: Any) -> float:
    return float("nan") if x is None else float(x)


_TEXT_COLUMNS = ("op", "device", "group", "kind", "model", "sharding", "set", "cost_model", "loops")


def _read_table(path: Path, index: str | None) -> pd.DataFrame:
    """A report table written by :meth:`Result.save`: text columns as text, energies NaN where
    empty."""
    frame = read_csv_exact(path, keep_default_na=False,
                           na_values={c: ["", "nan", "NaN"] for c in ("start_s", "end_s", "compute_energy_j",
                                                                      "comm_energy_j")})
    for col in _TEXT_COLUMNS:
        if col in frame.columns and col != "set":
            frame[col] = frame[col].astype(str)
    return frame.set_index(index) if index is not None else frame
