"""Measured fused mixture-of-experts kernels: the routed experts of one MoE layer on one GPU, as a
serving engine runs them in one fused operator.

An engine runs a MoE layer's routed experts as one fused operator: the tokens permuted to their
experts (and quantized under FP8), the experts' grouped gate/up GEMM with the gated activation,
the grouped down GEMM, the weighted un-permute. AIConfigurator measured that operator per engine
and GPU (``aiconfigurator-core``, ``systems/data/<gpu>/moe/<framework>/<version>/moe_perf.parquet``:
TensorRT-LLM's ``moe_torch_flow*`` operators, the router's GEMM and every collective excluded) by
tokens, hidden size, intermediate size, top-k, experts, the expert-tensor-parallel and
expert-parallel degrees of the GPU's share (``moe_tp``, ``moe_ep``), element type and the
routing's token distribution. ``marssim calibrate import aiconfigurator --families moe`` converts
those rows into ``traces/moe-kernels/<GPU>-aiconfigurator-moe.csv`` (:data:`COLUMNS`; every row its
source, version and licence).

A serving iteration's experts (:meth:`marssim.serve.itermodel.IterationModel._experts_time`) take
the measured operator where the GPU design's stack (``gpu.stack``, then ``gpu.fallback_stacks``)
measured the layer's exact shape under a balanced distribution (uniform ``expert_load``), else
their ops one by one. Between measured token counts the time is interpolated linearly in
``(ln tokens, ln seconds)``; beyond the largest it grows in proportion to the tokens (the
grouped GEMMs are then compute-bound); below the smallest it is the smallest's.

Units: seconds, tokens, elements.
"""

from __future__ import annotations

import bisect
import csv
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from marssim.errors import InputError

__all__ = ["COLUMNS", "MoeShape", "MoeKernelRow", "MoeCurve", "load_moe_kernels", "write_moe_kernels",
           "merge_moe_kernels", "curves", "moe_kernels_dir", "shipped_moe_curves", "moe_curve", "BALANCED"]

COLUMNS = ("device", "stack", "dtype", "tokens", "hidden", "inter", "top_k", "experts", "moe_tp", "moe_ep",
           "distribution", "seconds", "kernel", "source", "version", "license", "file", "date")
"""Columns of a measured MoE kernel table: the GPU (a calibration table's name), the software stack,
the element type of the experts' GEMMs, the tokens entering the layer on the GPU, the hidden and
(whole) intermediate size, top-k, experts, the GPU's expert-tensor-parallel and expert-parallel
degrees, the token distribution, the median seconds, the engine's operator, and provenance."""

BALANCED = "balanced"
"""The distribution of uniformly routed tokens."""


@dataclass(frozen=True)
class MoeShape:
    """What identifies a measured curve: the GPU, stack, element type and the layer's shape and
    split (sizes in elements; ``moe_tp`` splits ``inter``, ``moe_ep`` the experts)."""

    device: str
    stack: str
    dtype: str
    hidden: int
    inter: int
    top_k: int
    experts: int
    moe_tp: int
    moe_ep: int
    distribution: str


@dataclass(frozen=True)
class MoeKernelRow:
    """One measured MoE operator (see :data:`COLUMNS`); ``seconds`` per call."""

    shape: MoeShape
    tokens: int
    seconds: float
    kernel: str
    source: str
    version: str
    license: str
    file: str
    date: str

    def as_dict(self) -> dict[str, object]:
        s = self.shape
        return {"device": s.device, "stack": s.stack, "dtype": s.dtype, "tokens": self.tokens, "hidden": s.hidden,
                "inter": s.inter, "top_k": s.top_k, "experts": s.experts, "moe_tp": s.moe_tp, "moe_ep": s.moe_ep,
                "distribution": s.distribution, "seconds": f"{self.seconds:.6e}", "kernel": self.kernel,
                "source": self.source, "version": self.version, "license": self.license, "file": self.file,
                "date": self.date}


@dataclass(frozen=True)
class MoeCurve:
    """The measured seconds of one :class:`MoeShape` by tokens (ascending), and where they came from."""

    shape: MoeShape
    tokens: tuple[int, ...]
    seconds: tuple[float, ...]
    source: str

    def __call__(self, tokens: int) -> float:
        """Seconds of the operator on ``tokens`` tokens (see the module docstring)."""
        xs, ys = self.tokens, self.seconds
        if tokens <= xs[0]:
            return ys[0]
        if tokens >= xs[-1]:
            return ys[-1] * tokens / xs[-1]
        i = bisect.bisect_left(xs, tokens)
        if xs[i] == tokens:
            return ys[i]
        x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
        w = (math.log(tokens) - math.log(x0)) / (math.log(x1) - math.log(x0))
        return math.exp(math.log(y0) + w * (math.log(y1) - math.log(y0)))


_INTS = ("tokens", "hidden", "inter", "top_k", "experts", "moe_tp", "moe_ep")


def load_moe_kernels(path: str | Path) -> list[MoeKernelRow]:
    """The rows of one table (``#`` lines are comments); InputError naming the file, the line and
    the column for a missing column, a missing, empty or extra cell, or a value that is not what
    :data:`COLUMNS` says."""
    path = Path(path)
    with path.open(newline="") as f:
        lines = [(n, line) for n, line in enumerate(f, start=1) if not line.startswith("#")]
    reader = csv.DictReader((line for _, line in lines), restkey="_extra")
    missing = [c for c in COLUMNS if c not in (reader.fieldnames or ())]
    if missing:
        raise InputError(str(path), "columns", f"expected the columns {', '.join(COLUMNS)}; missing "
                                               f"{', '.join(missing)}")
    out = []
    for (n, _), r in zip(lines[1:], reader):
        where = f"line {n}"
        if r.get("_extra"):
            raise InputError(str(path), where, f"expected {len(reader.fieldnames)} cells, got more")
        for c in COLUMNS:
            if not r.get(c):
                raise InputError(str(path), f"{where}, {c}", "expected a value, got an empty or missing cell")
        ints = {}
        for c in _INTS:
            try:
                ints[c] = int(r[c])
            except ValueError:
                raise InputError(str(path), f"{where}, {c}", f"expected an integer, got {r[c]!r}") from None
            if ints[c] < 1:
                raise InputError(str(path), f"{where}, {c}", f"expected a positive integer, got {ints[c]}")
        try:
            seconds = float(r["seconds"])
        except ValueError:
            raise InputError(str(path), f"{where}, seconds", f"expected a number, got {r['seconds']!r}") from None
        if not seconds > 0 or not math.isfinite(seconds):
            raise InputError(str(path), f"{where}, seconds", f"expected positive finite seconds, got {seconds}")
        shape = MoeShape(r["device"], r["stack"], r["dtype"], ints["hidden"], ints["inter"], ints["top_k"],
                         ints["experts"], ints["moe_tp"], ints["moe_ep"], r["distribution"])
        out.append(MoeKernelRow(shape, ints["tokens"], seconds, r["kernel"], r["source"], r["version"],
                                r["license"], r["file"], r["date"]))
    return out


def write_moe_kernels(path: str | Path, rows: Sequence[MoeKernelRow], comments: Iterable[str] = ()) -> None:
    """Write ``rows`` (ordered by shape and tokens) under ``comments`` (one line each, ``# ``
    prepended where missing) to ``path``, atomically."""
    from marssim.fsutil import atomic_file

    ordered = sorted(rows, key=lambda r: (r.shape.device, r.shape.stack, r.shape.dtype, r.shape.hidden, r.shape.inter,
                                          r.shape.top_k, r.shape.experts, r.shape.moe_tp, r.shape.moe_ep,
                                          r.shape.distribution, r.tokens, r.kernel))
    with atomic_file(Path(path), "w", newline="") as fh:
        for c in comments:
            fh.write((c if c.startswith("#") else f"# {c}") + "\n")
        w = csv.DictWriter(fh, fieldnames=COLUMNS, lineterminator="\n")
        w.writeheader()
        for r in ordered:
            w.writerow(r.as_dict())


def merge_moe_kernels(path: str | Path, rows: Sequence[MoeKernelRow], comment: str) -> list[MoeKernelRow]:
    """Add ``rows`` to the table at ``path`` (created if absent): the file's rows of the same
    device and stack are replaced; its comments kept, ``comment`` added unless there. The rows."""
    p = Path(path)
    if not rows:
        raise InputError(str(p), "rows", "expected measured MoE operators to add, got none")
    replaced = {(r.shape.device, r.shape.stack) for r in rows}
    kept = [r for r in load_moe_kernels(p) if (r.shape.device, r.shape.stack) not in replaced] if p.exists() else []
    comments = [line.rstrip("\n") for line in p.read_text().splitlines() if line.startswith("#")] if p.exists() else []
    line = comment if comment.startswith("#") else f"# {comment}"
    if line not in comments:
        comments.append(line)
    out = kept + list(rows)
    write_moe_kernels(p, out, comments)
    return out


def curves(rows: Iterable[MoeKernelRow]) -> dict[MoeShape, MoeCurve]:
    """Per shape its curve; of several operators measured at one token count, the fastest (the
    engine picks its fastest)."""
    best: dict[MoeShape, dict[int, MoeKernelRow]] = {}
    for r in rows:
        at = best.setdefault(r.shape, {})
        if r.tokens not in at or r.seconds < at[r.tokens].seconds:
            at[r.tokens] = r
    out = {}
    for shape, at in best.items():
        xs = sorted(at)
        sources = sorted({f"{r.source} {r.version}" for r in at.values()})
        out[shape] = MoeCurve(shape, tuple(xs), tuple(at[x].seconds for x in xs),
                              f"{', '.join(sources)} {shape.stack}")
    return out


def moe_kernels_dir() -> Path:
    """Where the tables are read from: ``$MARSSIM_TRACES/moe-kernels`` where that is set (as the
    calibration tables, :func:`marssim.cost.calibrated.calibration_dir`), else the tables that ship
    with marssim (package data; :func:`marssim.data.moe_kernels`)."""
    if os.environ.get("MARSSIM_TRACES"):
        return Path(os.environ["MARSSIM_TRACES"]) / "moe-kernels"
    from marssim.data import moe_kernels

    return moe_kernels()


def shipped_moe_curves() -> dict[MoeShape, MoeCurve]:
    """The curves of every table of :func:`moe_kernels_dir` (``*.csv``), read once per directory."""
    return _curves_of(str(moe_kernels_dir()))


@lru_cache(maxsize=4)
def _curves_of(directory: str) -> dict[MoeShape, MoeCurve]:
    rows: list[MoeKernelRow] = []
    for path in sorted(Path(directory).glob("*.csv")):
        rows += load_moe_kernels(path)
    return curves(rows)


def moe_curve(device: str | None, stacks: str | Sequence[str] | None, dtype: str, hidden: int, inter: int,
              top_k: int, experts: int, moe_tp: int, moe_ep: int, distribution: str = BALANCED,
              table: dict[MoeShape, MoeCurve] | None = None) -> MoeCurve | None:
    """The measured curve of the first of ``stacks`` (a design's stack and its fallbacks, in order)
    that measured this layer on ``device``; None when none did."""
    if not device or not stacks:
        return None
    table = shipped_moe_curves() if table is None else table
    for stack in ((stacks,) if isinstance(stacks, str) else stacks):
        hit = table.get(MoeShape(device, stack, dtype, hidden, inter, top_k, experts, moe_tp, moe_ep, distribution))
        if hit is not None:
            return hit
    return None
