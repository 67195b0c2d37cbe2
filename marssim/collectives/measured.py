"""Measured collectives: the tables under ``traces/collectives/``, their converters from published
data, interpolation between measured sizes, and the achieved efficiency fitted to them.

Table schema (``*.csv``, ``#`` lines are comments saying where the file came from), one row per
measured (system, stack, collective, group, size):

==============  ==============================================================================
column          meaning
==============  ==============================================================================
system          the measured machine: ``dgx-a100`` (8 A100 SXM4 on NVSwitch), ``dgx-h100``,
                ``hgx-h100`` (8 H100 SXM5 on NVSwitch, host not named), ``nc-a100-v4`` (Azure:
                4 A100 PCIe, NVLink bridges between pairs), ``h100-nvl-pairs``, ``hgx-a100``,
                ``hgx-h200``, ``hgx-b200``, ``hgx-b300`` (8 GPUs of one HGX board), ``gb200-nvl72``,
                ``gb300-nvl72`` (GPUs of one NVL72 NVLink domain); a ``+net`` suffix: nodes
                joined by a network the source does not describe
gpu             ``A100``, ``H100``, ``H200``, ``B200``, ``B300``, ``GB200``, ``GB300``
stack           software stack that ran it (``vidur-2024``: PyTorch ``torch.distributed`` on NCCL;
                ``xla-2025``: XLA's collective performance table generator on NCCL;
                ``nccl-2.29.2``, ``nccl-2.27.3``: NCCL as AIConfigurator's collector ran it;
                ``trtllm-1.3.0rc20``, ``vllm-0.24.0``, ``sglang-0.5.14``: those engines' own
                all-reduce, :func:`marssim.calibrate.aiconfigurator.collective_rows`)
collective      ``all_reduce``, ``all_gather``, ``reduce_scatter``, ``send_recv``
ranks           GPUs in the group (>= 2)
ranks_per_node  GPUs of the group per node (``ranks`` inside one node)
bytes           message size as nccl-tests reports it: the all-reduce buffer, the all-gather output,
                the reduce-scatter input, the bytes sent (send/receive)
time_s          median time of the collective, s
dtype           element type moved (``fp16``, ``fp32``)
source, commit, file, license, date
                provenance (``date``: of the commit that last changed the file)
note            free text
==============  ==============================================================================

Converters: :func:`vidur_network_rows` (Vidur's ``data/profiling/network/<system>/<collective>.csv``:
``torch.distributed`` calls timed by ``torch.profiler``, the median over 3 profiled rounds of the
median NCCL kernel of 11 back-to-back calls on rank 0, fp16 buffers) and
:func:`xla_textproto_rows` (XLA's ``collective_interpolator_data.h``: the generator runs each
collective 5 times as an XLA program and records ``tensor bytes / median runtime``). Both keep
sizes on a geometric grid (:func:`geometric_sizes`: the measured size nearest each power of two
and three times a power of two, within 5 %), so every octave weighs the same in a median.

:func:`interpolate` gives the time of a measured configuration at any size inside its measured
range (log-log between the nearest measured sizes); :func:`fit_achieved` fits the two numbers by
which a stack's measured collectives differ from NCCL's own model (a fixed overhead per call and a
fraction of NCCL's bandwidth; :mod:`marssim.collectives.plan`).
"""

from __future__ import annotations

import csv
import datetime as _dt
import io
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from marssim.csvio import read_commented_table, write_commented_table
from marssim.errors import InputError

__all__ = ["COLUMNS", "COLLECTIVES", "CollectiveRow", "load_collectives", "load_collective_tables", "write_collectives",
           "vidur_network_rows", "xla_textproto_rows", "geometric_sizes", "interpolate", "Achieved", "fit_achieved",
           "collectives_dir", "configurations"]

COLUMNS = ("system", "gpu", "stack", "collective", "ranks", "ranks_per_node", "bytes", "time_s", "dtype", "source",
           "commit", "file", "license", "date", "note")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "send_recv")


@dataclass(frozen=True)
class CollectiveRow:
    """One measured collective (see the module docstring); SI units."""

    system: str
    gpu: str
    stack: str
    collective: str
    ranks: int
    ranks_per_node: int
    bytes: float
    time_s: float
    dtype: str
    source: str
    commit: str
    file: str
    license: str
    date: str
    note: str = ""

    @property
    def nodes(self) -> int:
        return max(1, self.ranks // self.ranks_per_node)

    @property
    def config(self) -> tuple[str, str, str, str, int, int]:
        """``(system, gpu, stack, collective, ranks, ranks_per_node)``: one measured curve."""
        return (self.system, self.gpu, self.stack, self.collective, self.ranks, self.ranks_per_node)

    @property
    def bus_bandwidth(self) -> float:
        """nccl-tests' bus bandwidth (bytes/s): ``bytes / time`` times ``2 (n - 1) / n`` (all-reduce),
        ``(n - 1) / n`` (all-gather, reduce-scatter), 1 (send/receive)."""
        n = self.ranks
        factor = {"all_reduce": 2 * (n - 1) / n, "all_gather": (n - 1) / n, "reduce_scatter": (n - 1) / n}
        return self.bytes / self.time_s * factor.get(self.collective, 1.0)


def collectives_dir() -> Path:
    """The shipped measured-collective tables: ``$MARSSIM_TRACES/collectives`` or the package data
    (:func:`marssim.data.collectives`)."""
    import os

    if os.environ.get("MARSSIM_TRACES"):
        return Path(os.environ["MARSSIM_TRACES"]) / "collectives"
    from marssim.data import collectives

    return collectives()


def write_collectives(path: str | Path, rows: Sequence[CollectiveRow], comments: Sequence[str]) -> None:
    """Write a table atomically, ``comments`` first (``# `` prepended where missing)."""
    write_commented_table(path, COLUMNS, ([r.system, r.gpu, r.stack, r.collective, r.ranks, r.ranks_per_node,
                                           f"{r.bytes:.0f}", f"{r.time_s:.6e}", r.dtype, r.source, r.commit, r.file,
                                           r.license, r.date, r.note] for r in rows), comments)


def load_collectives(path: str | Path) -> list[CollectiveRow]:
    """Read and check one table (an :class:`~marssim.errors.InputError` naming file, line, column)."""
    name = str(path)
    out = []
    for lineno, cells in read_commented_table(path, COLUMNS, "collective table"):
        where = f"line {lineno}"
        if cells["collective"] not in COLLECTIVES:
            raise InputError(name, f"{where}: collective", f"expected one of {', '.join(COLLECTIVES)}, "
                                                           f"got {cells['collective']!r}")
        try:
            ranks, ppn = int(cells["ranks"]), int(cells["ranks_per_node"])
        except ValueError:
            raise InputError(name, f"{where}: ranks", "expected integers for ranks and ranks_per_node") from None
        if ranks < 2 or ppn < 1 or ppn > ranks or ranks % ppn:
            raise InputError(name, f"{where}: ranks_per_node", f"expected 1 <= ranks_per_node <= ranks (>= 2), a "
                                                               f"divisor of it; got {ppn} of {ranks}")
        values = {}
        for col in ("bytes", "time_s"):
            try:
                values[col] = float(cells[col])
                if not (math.isfinite(values[col]) and values[col] > 0):
                    raise ValueError
            except ValueError:
                raise InputError(name, f"{where}: {col}", f"expected a number > 0, got {cells[col]!r}") from None
        try:
            _dt.date.fromisoformat(cells["date"])
        except ValueError:
            raise InputError(name, f"{where}: date", f"expected an ISO date, got {cells['date']!r}") from None
        out.append(CollectiveRow(cells["system"], cells["gpu"], cells["stack"], cells["collective"], ranks, ppn,
                                 values["bytes"], values["time_s"], cells["dtype"], cells["source"], cells["commit"],
                                 cells["file"], cells["license"], cells["date"], cells.get("note", "")))
    return out


def load_collective_tables(directory: str | Path | None = None) -> list[CollectiveRow]:
    """Every ``*.csv`` table of ``directory`` (default: :func:`collectives_dir`), in file order (read
    once per process and files' sizes and times)."""
    root = Path(directory) if directory is not None else collectives_dir()
    paths = sorted(root.glob("*.csv"))
    return list(_load_files(tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in paths)))


@lru_cache(maxsize=8)
def _load_files(files: tuple[tuple[str, int, int], ...]) -> tuple[CollectiveRow, ...]:
    rows: list[CollectiveRow] = []
    for path, _, _ in files:
        rows.extend(load_collectives(path))
    return tuple(rows)


def configurations(rows: Iterable[CollectiveRow]) -> dict[tuple, list[CollectiveRow]]:
    """Rows by :attr:`CollectiveRow.config`, each curve sorted by size."""
    out: dict[tuple, list[CollectiveRow]] = {}
    for r in rows:
        out.setdefault(r.config, []).append(r)
    return {k: sorted(v, key=lambda r: r.bytes) for k, v in out.items()}


def geometric_sizes(sizes: Sequence[float], tolerance: float = 0.05) -> list[int]:
    """Indices of ``sizes`` nearest (in log) to each power of two and three times a power of two
    inside their range, when within ``tolerance`` of it; in increasing size."""
    if not sizes:
        return []
    lo, hi = min(sizes), max(sizes)
    targets = sorted({float(m * 2 ** e) for e in range(0, 48) for m in (1, 3) if lo * 0.95 <= m * 2 ** e <= hi * 1.05})
    chosen: dict[int, float] = {}
    for t in targets:
        i = min(range(len(sizes)), key=lambda j: abs(math.log(sizes[j] / t)))
        if abs(sizes[i] / t - 1) <= tolerance:
            chosen[i] = t
    return sorted(chosen, key=lambda i: sizes[i])


def vidur_network_rows(text: str, *, system: str, net_system: str, gpu: str, stack: str, source: str, commit: str,
                       file: str, license_: str, date: str) -> list[CollectiveRow]:
    """The rows of one Vidur network file (``all_reduce.csv`` or ``send_recv.csv``): per
    (collective, ranks, ranks per node) the sizes of :func:`geometric_sizes`; groups inside one
    node get ``system``, groups spanning nodes ``net_system``. InputError on another format."""
    reader = csv.DictReader(io.StringIO(text))
    header = reader.fieldnames or []
    for col in ("num_workers", "devices_per_node", "size", "collective"):
        if col not in header:
            raise InputError(file, "header", f"expected Vidur's network profile columns; missing {col}")
    curves: dict[tuple[str, int, int], list[tuple[float, float]]] = {}
    for line, row in enumerate(reader, start=2):
        coll = row["collective"].strip()
        if coll not in COLLECTIVES:
            raise InputError(file, f"line {line}: collective", f"expected one of {', '.join(COLLECTIVES)}, got {coll!r}")
        med = (row.get(f"time_stats.{coll}.median") or "").strip()
        if not med:
            continue
        try:
            key = (coll, int(row["num_workers"]), int(row["devices_per_node"]))
            size, ms = float(row["size"]), float(med)
        except ValueError:
            raise InputError(file, f"line {line}", "expected numbers for num_workers, devices_per_node, size, time") \
                from None
        if ms > 0:
            curves.setdefault(key, []).append((size, ms * 1e-3))
    out = []
    for (coll, ranks, ppn), points in sorted(curves.items()):
        points.sort()
        sizes = [s for s, _ in points]
        ppn = min(ppn, ranks)
        for i in geometric_sizes(sizes):
            size, t = points[i]
            out.append(CollectiveRow(system if ranks == ppn else net_system, gpu, stack, coll, ranks, ppn, size, t,
                                     "fp16", source, commit, file, license_, date))
    return out


_ENTRY = re.compile(
    r'opcode:\s*"(?P<op>[a-z-]+)".*?dimensions:\s*(?P<dim>\d+).*?num_replica_groups:\s*(?P<groups>\d+)\s*'
    r'num_devices_per_group:\s*(?P<per>\d+).*?network_throughput_bytes_per_sec:\s*(?P<thr>\d+)', re.S)


def xla_textproto_rows(text: str, *, system: str, gpu: str, stack: str, source: str, commit: str, file: str,
                       license_: str, date: str, min_bytes: float = 0.0) -> list[CollectiveRow]:
    """The all-reduce, all-gather and reduce-scatter entries of XLA's collective performance table
    (textproto) with at least two devices per group: ``bytes`` the generator's tensor size
    (all-reduce: the buffer; all-gather: the output, which the entry's shape is; reduce-scatter:
    the input, ``devices x`` the entry's output shape; 4-byte F32 elements), ``time_s`` that over
    the recorded throughput. Sizes below ``min_bytes`` are left out."""
    names = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}
    out = []
    for block in re.split(r"\n\s*entries\s*\{\s*\n\s*instruction", text):
        m = _ENTRY.search(block)
        if m is None or m.group("op") not in names:
            continue
        per = int(m.group("per"))
        if per < 2:
            continue
        coll = names[m.group("op")]
        nbytes = 4.0 * int(m.group("dim")) * (per if coll == "reduce_scatter" else 1)
        if nbytes < min_bytes:
            continue
        thr = float(m.group("thr"))
        out.append(CollectiveRow(system, gpu, stack, coll, per, per, nbytes, nbytes / thr, "fp32", source, commit, file,
                                 license_, date))
    return sorted(out, key=lambda r: (r.collective, r.ranks, r.bytes))


def interpolate(curve: Sequence[CollectiveRow], nbytes: float) -> float | None:
    """The time (s) of ``nbytes`` on a measured curve (rows of one configuration sorted by size):
    log-log interpolation between the two measured sizes around it; None outside the range."""
    if not curve or nbytes < curve[0].bytes * (1 - 1e-9) or nbytes > curve[-1].bytes * (1 + 1e-9):
        return None
    for a, b in zip(curve, curve[1:]):
        if a.bytes <= nbytes <= b.bytes:
            if b.bytes == a.bytes:
                return a.time_s
            w = math.log(nbytes / a.bytes) / math.log(b.bytes / a.bytes)
            return math.exp((1 - w) * math.log(a.time_s) + w * math.log(b.time_s))
    return curve[0].time_s


@dataclass(frozen=True)
class Achieved:
    """How measured collectives of a stack differ from NCCL's model on a transport: a fixed
    ``overhead`` per call (s; the framework's call, the launch, the ranks' skew), a factor on
    NCCL's latency (``latency_scale``: its per-step synchronisation as the stack runs it) and the
    fraction of NCCL's bandwidth reached (``bandwidth_fraction``); fitted on ``points`` rows, with
    ``median_error`` of ``|model / measured - 1|`` on them."""

    overhead: float
    bandwidth_fraction: float
    latency_scale: float = 1.0
    points: int = 0
    median_error: float = 0.0

    def time(self, latency: float, nbytes: float, bandwidth: float) -> float:
        """Seconds of a collective NCCL's model gives ``latency`` (s) and ``bandwidth`` (bytes/s)."""
        return self.overhead + self.latency_scale * latency + nbytes / (self.bandwidth_fraction * bandwidth)


def fit_achieved(rows: Sequence[CollectiveRow], model: Callable[[CollectiveRow], tuple[float, float]],
                 min_bytes: float = 2 ** 20) -> Achieved | None:
    """Least squares on log time of :meth:`Achieved.time` over the ``rows`` of at least
    ``min_bytes``, ``model(row)`` giving NCCL's ``(latency s, bandwidth bytes/s)`` of the algorithm
    and protocol NCCL picks for the row; None with fewer than 3 rows. The latency scale stays 1:
    fitted too, it made the held-out curves worse (it trades against the overhead per call)."""
    import numpy as np
    from scipy.optimize import least_squares

    use = [r for r in rows if r.bytes >= min_bytes]
    if len(use) < 3:
        return None
    lat = np.array([model(r)[0] for r in use])
    bw = np.array([model(r)[1] for r in use])
    nbytes = np.array([r.bytes for r in use])
    t = np.array([r.time_s for r in use])
    scaled = False  # a factor on NCCL's latency: tried, it does not predict held-out group sizes better

    def residual(theta):
        scale = theta[2] if scaled else 1.0
        return np.log(theta[0] * 1e-6 + scale * lat + nbytes / (theta[1] * bw)) - np.log(t)

    x0, lo, hi = [5.0, 0.8, 1.0], [0.0, 0.05, 0.2], [1000.0, 4.0, 10.0]
    n = 3 if scaled else 2
    best = least_squares(residual, x0[:n], bounds=(lo[:n], hi[:n]))
    err = np.abs(np.expm1(residual(best.x)))
    return Achieved(float(best.x[0]) * 1e-6, float(best.x[1]), float(best.x[2]) if scaled else 1.0, len(use),
                    float(np.median(err)))
