"""The cost-model engine: dispatch on the design's dataflow, memoise by shape, vectorise.

:class:`DataflowCost` times any op on any design by the formulas of its dataflow:

==================  ================================  ==========================================
dataflow            model (``OpCost.model``)          module
==================  ================================  ==========================================
os, ws, is          ``systolic-os/ws/is``             :mod:`marssim.cost.systolic` (SCALE-Sim)
rs, nvdla,          ``loopmap-rs/nvdla/shidiannao``   :mod:`marssim.cost.loopmap` (Eyeriss,
shidiannao                                            NVDLA, ShiDianNao)
gpu                 ``gpu-roofline`` / ``fitted``     :mod:`marssim.cost.gpu`,
                    / ``measured`` /                  :mod:`marssim.cost.calibrated`,
                    ``interpolated`` /                :mod:`marssim.cost.attention_grid`,
                    ``derived`` /                     :mod:`marssim.cost.attention_backward`,
                    ``rescaled``                      :mod:`marssim.cost.attention_kernels`
(non-GEMM ops on    ``bandwidth``                     :mod:`marssim.cost.bandwidth`
 PE arrays)
==================  ================================  ==========================================

Energy (J), where the design has ``energy`` figures, else NaN: compute + SRAM + DRAM::

    MACs x mac + static_power x time
      + buffer bytes read x sram_read + buffer bytes written x sram_write
      + DRAM bytes read x dram_read + DRAM bytes written x dram_write

(non-GEMM ops: FLOPs x mac / 2 for the arithmetic; buffer bytes are the array's accesses plus
the DRAM fills written into the buffer and the drains read out of it; GPU designs count no
buffer bytes and charge their DRAM bytes as reads). ``OpCost`` carries the three parts.
``utilisation`` is MACs / (time x peak MAC/s): the PE array's peak, or for GPUs half the dense
peak FLOP/s of the op's dtype.

Speed. An op is reduced once to a tuple of integers (:func:`marssim.cost.features.op_features`)
and a design to a :class:`~marssim.cost.features.DesignParams`; both are interned to small ids
(cached per object, so repeated calls with the same objects skip even that) and the result of
each (shape, design) pair is memoised, so shards of equal shape -- across ops, lowerings and GA
candidates -- are computed once. :meth:`DataflowCost.op_times` evaluates many pairs with numpy
using the very same formula code, which gives bit-identical results to :meth:`op_cost`; it
evaluates each distinct (shape, design) pair once when shapes repeat. Callers that evaluate the
same ops again and again can intern them once (:meth:`DataflowCost.shape_ids`,
:meth:`DataflowCost.design_ids`) and call the array-only :meth:`DataflowCost.times`;
:meth:`DataflowCost.op_time_table` gives every op on every design. Caches are dropped when the
model is pickled (search workers rebuild them) and bounded in size.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from marssim.errors import InputError, warn_input
from marssim.system import Design
from marssim.system.design import DATAFLOWS, SYSTOLIC_DATAFLOWS
from marssim.workload import Op

from . import fitcache
from .attention_backward import forward_twin, twin_ratio
from .attention_grid import AttentionGrid, op_seconds, row_entries
from .gemm_grid import grid_from_measured
from .gemm_grid import op_seconds as gemm_seconds
from .attention_kernels import AttentionRescale, generation_of, load_kernel_set
from .bandwidth import stream_op
from .base import OpCost
from .fitcache import DesignTables
from .calibrated import DTYPE_STANDINS, TUNINGS, FitKey, KernelFit, KernelTable, KernelTiming, fit, load_table
from .features import (
    CLASS_GEMM, CLASS_NONE, CLASS_STREAM, DTYPES, F_BACKEND, F_CLASS, F_DTYPE, F_FLOPS, F_G, F_KERNEL, F_KK, F_M,
    F_MACS, F_NN, F_PHASE, F_TRAFFIC, KERNEL_BACKENDS, KERNEL_KINDS, KERNEL_PHASES, N_FEATURES, Dataflow,
    DesignParams, attention_geometry_key, conv_geometry_key, design_key, lookup_backend, op_features,
)
from .gpu import GpuTable, design_peaks, gpu_gemm, gpu_stream
from .loopmap import nvdla_gemm, rs_gemm, shidiannao_gemm
from .systolic import systolic_gemm

__all__ = ["DataflowCost", "SystolicCost", "LoopMapCost", "GpuRooflineCost", "CalibratedCost", "design_stacks"]

_log = logging.getLogger("marssim.cost")

_ZERO = OpCost(0.0, 0.0, 0.0, 0.0, 0.0, 0.0, "none", 0.0, 0.0, 0.0, 0.0, 0.0)
_MODEL_NAMES = ("systolic-os", "systolic-ws", "systolic-is", "loopmap-rs", "loopmap-nvdla", "loopmap-shidiannao")
_LOOPMAP = {Dataflow.RS: rs_gemm, Dataflow.NVDLA: nvdla_gemm, Dataflow.SHIDIANNAO: shidiannao_gemm}

MAX_OBJECT_CACHE = 1 << 14
"""Entries of the per-object (``id``) caches before they are cleared (they keep objects alive)."""
MAX_MEMO = 1 << 18
"""(shape, design) results kept before the memo is cleared."""
MAX_SHAPES = 1 << 18
"""Distinct ops (by value) kept before every cache is cleared."""


class _Columns:
    """Feature columns of a set of interned ops, gathered lazily (a formula reads ~12 of 29)."""

    __slots__ = ("matrix", "fids", "cache")

    def __init__(self, matrix: np.ndarray, fids: np.ndarray) -> None:
        self.matrix = matrix
        self.fids = fids
        self.cache: dict[int, np.ndarray] = {}

    def __getitem__(self, i: int) -> np.ndarray:
        col = self.cache.get(i)
        if col is None:
            col = self.cache[i] = self.matrix[i][self.fids]
        return col


_SHARED_FITS: dict[tuple, dict] = {}  # see DataflowCost._fitted
_SHARED_TABLES: dict[tuple, DesignTables] = {}  # see DataflowCost._design_tables


def design_stacks(design: Design) -> str | tuple[str, ...] | None:
    """The software stack(s) whose rows time a GPU design's kernels: ``gpu.stack``, or with
    ``gpu.fallback_stacks`` the tuple of it and them, in order of preference."""
    gpu = design.gpu
    fallback = tuple(s for s in gpu.fallback_stacks if s and s != gpu.stack)
    if gpu.stack is None or not fallback:
        return gpu.stack
    return (gpu.stack, *fallback)


def kernel_sources(design: Design) -> str:
    """What times a GPU design's kernels and collectives, in one line for run reports: its
    calibration table and stack (``gpu.stack``), the stacks taking the kernel families it did not
    measure (``gpu.fallback_stacks``), the fused attention kernel set (``gpu.attention_kernels``)
    and the collectives' stack (``gpu.collective_stack``, else the kernels'; NCCL's own model where
    the measured collectives have no such stack); empty for a design that is not a GPU."""
    gpu = design.gpu
    if gpu is None:
        return ""
    if not gpu.calibration:
        return f"{design.name}: every kernel by the roofline (no calibration table named)"
    text = f"{design.name}: {gpu.calibration} tables of stack {gpu.stack or 'any'}"
    fallback = [s for s in gpu.fallback_stacks if s and s != gpu.stack]
    if fallback:
        text += f" ({', '.join(fallback)} for the families it lacks)"
    if gpu.attention_kernels:
        text += f", prompt attention {gpu.attention_kernels}"
    collectives = gpu.collective_stack or gpu.stack
    if collectives:
        from marssim.collectives.measured import load_collective_tables

        measured = collectives in {r.stack for r in load_collective_tables()}
        text += f", collectives {collectives}" if measured else ", collectives by NCCL's model"
    return text


def _first_stack_rows(rows: Sequence[KernelTiming], stacks: tuple[str, ...]) -> tuple[KernelTiming, ...]:
    """Of ``rows``, those of unknown stack and, per kernel family (kind, dtype, attention
    backend), those of the first of ``stacks`` that has rows of the family; in table order."""
    rank = {s: i for i, s in enumerate(stacks)}
    first: dict[tuple[str, str, str], int] = {}
    for r in rows:
        if r.stack in rank:
            family = (r.kind, r.dtype, lookup_backend(r.kind, r.backend))
            first[family] = min(first.get(family, len(stacks)), rank[r.stack])
    return tuple(r for r in rows if not r.stack or (r.stack in rank and
                                                    rank[r.stack] == first[(r.kind, r.dtype,
                                                                            lookup_backend(r.kind, r.backend))]))


def _table_files(source: Path) -> tuple | None:
    """What identifies the tables read from ``source`` (a directory of ``*.csv`` or one file):
    each file's resolved path, size and modification time (ns); None when there is none."""
    paths = sorted(source.glob("*.csv")) if source.is_dir() else [source] if source.is_file() else []
    out = []
    for path in paths:
        st = path.stat()
        out.append((str(path.resolve()), st.st_size, st.st_mtime_ns))
    return tuple(out) or None


class DataflowCost:
    """Times any op on any design by its dataflow (see the module docstring); the default model.

    ``calibration`` says where GPU-class designs find measured kernel timings: a directory of
    calibration CSVs or one CSV file (read when a GPU design first needs it), a
    :class:`~marssim.cost.calibrated.KernelTable` (fitted at once), a mapping of
    :class:`~marssim.cost.calibrated.KernelFit` by key, or None (analytical GPU roofline only).
    A GPU design uses the rows whose ``device`` (or file name) equals its ``gpu.calibration``;
    per (kernel kind, dtype) the most tuned group present wins (``tuning``: most preferred first).
    With ``measured`` (the default) an op whose kernel shape is in the table takes the measured
    median (``OpCost.model == "measured"``), every other shape the fitted curve times, with
    ``correction`` (the default), the local residual correction from the measured shapes near
    it (:mod:`marssim.cost.residual`); see :mod:`marssim.cost.calibrated`.

    A GPU design whose ``gpu.calibration`` names a table that none of the sources holds is an
    :class:`~marssim.errors.InputError` (naming the table and where it was looked for) when the
    design is first used, unless ``allow_uncalibrated`` asks for the analytical roofline instead
    (an :class:`~marssim.errors.InputWarning` then says so). ``calibration=None`` is the roofline
    by choice. Every :class:`OpCost` names the model that timed it (``OpCost.model``).
    """

    dataflows: tuple[str, ...] = DATAFLOWS
    """Dataflows this model accepts (subclasses restrict it)."""

    def __init__(self, *, calibration: str | Path | KernelTable | Mapping[FitKey, KernelFit] | None = None,
                 tuning: Sequence[str] = tuple(reversed(TUNINGS)), measured: bool = True,
                 correction: bool = True, allow_uncalibrated: bool = False) -> None:
        self._source: Path | None = None
        self._table: KernelTable | None = None
        self._given_fits: dict[FitKey, KernelFit] | None = None
        if isinstance(calibration, KernelTable):
            self._table = calibration
        elif isinstance(calibration, (str, Path)):
            self._source = Path(calibration)
        elif calibration is not None:
            self._given_fits = dict(calibration)
        for t in tuning:
            if t not in TUNINGS:
                raise ValueError(f"unknown tuning {t!r}; expected some of {', '.join(TUNINGS)}")
        self.tuning = tuple(tuning)
        self.measured = bool(measured)
        self.correction = bool(correction)
        self.allow_uncalibrated = bool(allow_uncalibrated)
        self._calibrated = calibration is not None  # None: the analytical roofline, by choice
        self._device_fits: dict[str, dict[tuple[str, str], KernelFit]] = {}
        self._device_measured: dict[str, dict[tuple[int, ...], KernelTiming]] = {}
        self._file_tables: dict[Path, KernelTable] = {}  # a directory's tables, each read when first needed
        self._file_list: tuple[Path, ...] | None = None  # the directory's tables when first looked at
        self._reset()

    # ------------------------------------------------------------------ pickling and caches
    def _reset(self) -> None:
        self._warned: set[str] = set()  # tables reported missing (allow_uncalibrated)
        self._op_ids: dict[int, tuple[Op, int]] = {}
        self._fid_by_op: dict[Op, int] = {}
        self._design_ids: dict[int, tuple[Design, int]] = {}
        self._rows: list[tuple[int, ...]] = []
        self._fid_of: dict[tuple[int, ...], int] = {}
        self._dparams: list[DesignParams] = []
        self._did_of: dict[tuple, int] = {}
        self._memo: dict[tuple[int, int], OpCost] = {}
        self._matrix: np.ndarray = np.zeros((N_FEATURES, 0), dtype=np.int64)
        self._matrix_n = 0
        self._measured_cols: dict[int, np.ndarray] = {}
        self._between_cols: dict[int, np.ndarray] = {}
        self._derived_cols: dict[int, np.ndarray] = {}
        self._rescaled_cols: dict[int, np.ndarray] = {}
        self._grids: dict[tuple, AttentionGrid] = {}
        self._factor_cols: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict:
        return {"source": self._source, "table": self._table, "given_fits": self._given_fits,
                "tuning": self.tuning, "device_fits": self._device_fits, "measured": self.measured,
                "device_measured": self._device_measured, "correction": self.correction,
                "allow_uncalibrated": self.allow_uncalibrated, "calibrated": self._calibrated,
                "file_tables": self._file_tables, "file_list": self._file_list}

    def __setstate__(self, state: dict) -> None:
        self._source = state["source"]
        self._table = state["table"]
        self._file_tables = state.get("file_tables", {})
        self._file_list = state.get("file_list")
        self._given_fits = state["given_fits"]
        self.tuning = state["tuning"]
        self._device_fits = state["device_fits"]
        self.measured = state.get("measured", True)
        self._device_measured = state.get("device_measured", {})
        self.correction = state.get("correction", True)
        self.allow_uncalibrated = state.get("allow_uncalibrated", False)
        self._calibrated = state.get("calibrated", True)
        self._reset()

    def clear_cache(self) -> None:
        """Forget memoised results and interned shapes/designs (fits are kept)."""
        self._reset()

    @property
    def cache_size(self) -> int:
        """Memoised (shape, design) results."""
        return len(self._memo)

    # ------------------------------------------------------------------ interning
    def _fid(self, op: Op) -> int:
        entry = self._op_ids.get(id(op))
        if entry is not None and entry[0] is op:
            return entry[1]
        fid = self._fid_by_op.get(op)
        if fid is None:
            feats = op_features(op)
            fid = self._fid_of.get(feats)
            if fid is None:
                fid = self._fid_of[feats] = len(self._rows)
                self._rows.append(feats)
            self._fid_by_op[op] = fid
        if len(self._op_ids) >= MAX_OBJECT_CACHE:
            self._op_ids.clear()
        self._op_ids[id(op)] = (op, fid)
        return fid

    def _did(self, design: Design) -> int:
        entry = self._design_ids.get(id(design))
        if entry is not None and entry[0] is design:
            return entry[1]
        key = design_key(design)
        did = self._did_of.get(key)
        if did is None:
            if design.dataflow not in self.dataflows:
                raise ValueError(f"{type(self).__name__} times {', '.join(self.dataflows)} designs; design "
                                 f"{design.name!r} has dataflow {design.dataflow!r}")
            params = DesignParams(design)
            if design.dataflow == "gpu":
                params.gpu = self._gpu_table(design)
            did = self._did_of[key] = len(self._dparams)
            self._dparams.append(params)
        if len(self._design_ids) >= MAX_OBJECT_CACHE:
            self._design_ids.clear()
        self._design_ids[id(design)] = (design, did)
        return did

    # ------------------------------------------------------------------ calibration
    def _load_table(self, name: str | None = None) -> KernelTable:
        """The rows this model reads; from a directory of tables and for a device ``name`` (lower
        case), those of the files that can hold its rows (the name is the file's or appears in its
        text), each file read once, of the files the directory held when first looked at."""
        if self._table is None and name is not None and self._source is not None and self._source.is_dir():
            if self._file_list is None:
                self._file_list = tuple(sorted(self._source.glob("*.csv")))
            table = KernelTable(())
            for path in self._file_list:
                got = self._file_tables.get(path)
                if got is None:
                    if path.stem.lower() != name and name not in path.read_text(encoding="utf-8-sig").lower():
                        continue
                    got = self._file_tables[path] = fitcache.cached_table(path, load_table)
                elif path.stem.lower() != name and name not in {d.lower() for d in got.devices()}:
                    continue
                table = table + got
            return table
        if self._table is None:
            src = self._source
            if src is None:
                self._table = KernelTable(())
            elif src.is_dir():
                table = KernelTable(())
                for path in sorted(src.glob("*.csv")):
                    table = table + fitcache.cached_table(path, load_table)
                self._table = table
            elif src.is_file():
                self._table = fitcache.cached_table(src, load_table)
            else:
                self._table = KernelTable(())
        return self._table

    def _device_rows(self, name: str, stack: str | tuple[str, ...] | None = None) -> tuple[KernelTiming, ...]:
        """Rows of the table whose device or file name equals ``name`` (lower case) and, for a
        ``stack``, measured on it or on an unknown stack (:meth:`KernelTable.for_stack`); for a
        tuple of stacks (:func:`design_stacks`), each kernel family's (kind, dtype, attention
        backend) rows of the first stack that measured it."""
        if isinstance(stack, tuple):
            return _first_stack_rows(self._device_rows(name), stack)
        table = self._load_table(name)
        stems: dict[str, str] = {}  # per source: its file's name without suffix, lower case

        def stem(source: str) -> str:
            file = source.rsplit(":", 1)[0]
            hit = stems.get(file)
            if hit is None:
                hit = stems[file] = Path(file).stem.lower()
            return hit

        return tuple(r for r in table.rows
                     if (r.device.lower() == name or stem(r.source) == name)
                     and (stack is None or r.stack in (stack, "")))

    def fits_for(self, device: str, peaks: dict[str, float] | None = None,
                 stack: str | None = None) -> dict[tuple[str, str], KernelFit]:
        """The fits a GPU design with ``gpu.calibration == device`` (and ``gpu.stack == stack``)
        uses, by (kind, dtype); ``peaks`` (the design's dense peak FLOP/s per dtype) bound the
        GEMM-class curves' rate. A dtype without a fit of its own takes its stand-in's
        (:data:`~marssim.cost.calibrated.DTYPE_STANDINS`: ``bf16`` and ``fp16`` run at the same
        tensor-core rate and move the same bytes)."""
        name = device.lower()
        cache_key = (name, tuple(sorted((peaks or {}).items())), stack)
        got = self._device_fits.get(cache_key)
        if got is not None:
            return got
        if self._given_fits is not None:
            fits = {k: f for k, f in self._given_fits.items() if k[0].lower() == name}
        else:
            fits = self._fitted(name, peaks, stack)
        rank = {t: i for i, t in enumerate(self.tuning)}
        chosen: dict[tuple[str, str], KernelFit] = {}
        for (_, kind, dtype, tuning), f in sorted(fits.items()):
            if tuning not in rank:
                continue
            current = chosen.get((kind, dtype))
            if current is None or rank[tuning] < rank[current.tuning]:
                chosen[(kind, dtype)] = f
        for (kind, dtype), f in list(chosen.items()):
            twin = DTYPE_STANDINS.get(dtype)
            if twin is not None and (kind, twin) not in chosen:
                chosen[(kind, twin)] = f
        if self._source is not None or self._table is not None or self._given_fits is not None:
            _log.info("calibration %s: %d fitted (kind, dtype) groups", device, len(chosen))
        self._device_fits[cache_key] = chosen
        return chosen

    def _fitted(self, name: str, peaks: dict[str, float] | None, stack: str | None) -> dict[FitKey, KernelFit]:
        """:func:`~.calibrated.fit` of the rows of ``name`` (and ``stack``) under ``peaks``. Fits of
        tables read from files are shared by every cost model of the process reading the same
        files unchanged (their paths, sizes and modification times): the fit is deterministic.
        Across processes, a fit is read from :mod:`.fitcache` (keyed by the rows' content)."""
        files = _table_files(self._source) if self._source is not None else None
        key = (files, name, tuple(sorted((peaks or {}).items())), stack) if files else None
        if key is not None:
            hit = _SHARED_FITS.get(key)
            if hit is not None:
                return hit
        rows = self._device_rows(name, stack)
        fits = {}
        if rows:  # computed once per table and kept on disk (fitcache), as it is deterministic
            disk_key = fitcache.fit_key(rows, peaks, name, stack)
            fits = fitcache.load_fits(disk_key)
            if fits is None:
                fits = fit(KernelTable(rows), peaks=peaks)
                fitcache.store_fits(disk_key, fits)
        if key is not None:
            _SHARED_FITS[key] = fits
        return fits

    def measured_for(self, device: str, stack: str | None = None) -> dict[tuple, KernelTiming]:
        """The measured rows a GPU design with ``gpu.calibration == device`` (and ``gpu.stack ==
        stack``) uses directly, by shape code ``(kernel kind index, dtype index, batch, m, n, k,
        flops, bytes, geometry, phase index, backend index)`` (see
        :func:`~marssim.cost.calibrated.shape_key`): per shape, the row of the most preferred
        tuning, then the smallest median; a shape measured in one dtype of
        :data:`~marssim.cost.calibrated.DTYPE_STANDINS` and not the other is used for both.
        Empty when built from fits alone."""
        name = device.lower()
        got = self._device_measured.get((name, stack))
        if got is not None:
            return got
        chosen: dict[tuple[int, ...], KernelTiming] = {}
        if self._given_fits is None:
            rank = {t: i for i, t in enumerate(self.tuning)}
            kind_index = {k: i for i, k in enumerate(KERNEL_KINDS)}
            dtype_index = {d: i for i, d in enumerate(DTYPES)}
            phase_index = {p: i for i, p in enumerate(KERNEL_PHASES)}
            backend_index = {b: i for i, b in enumerate(KERNEL_BACKENDS)}
            for r in self._device_rows(name, stack):
                if r.tuning not in rank:
                    continue
                key = r.shape
                code = (kind_index[key[0]], dtype_index[key[1]], *key[2:-2], phase_index[key[-2]],
                        backend_index[key[-1]])
                current = chosen.get(code)
                if current is None or (rank[r.tuning], r.median_s) < (rank[current.tuning], current.median_s):
                    chosen[code] = r
            standins = {dtype_index[a]: dtype_index[b] for a, b in DTYPE_STANDINS.items()}
            for code, r in list(chosen.items()):
                twin = standins.get(code[1])
                if twin is not None:
                    chosen.setdefault((code[0], twin, *code[2:]), r)
        self._device_measured[(name, stack)] = chosen
        return chosen

    def _searched(self) -> str:
        """Where this model looks for calibration tables, for messages."""
        if self._source is not None:
            if self._source.is_dir():
                files = sorted(p.name for p in self._source.glob("*.csv"))
                return (f"the *.csv files of {self._source} ({', '.join(files) if files else 'none there'}): "
                        "rows whose device, or file name, is the table's name")
            return f"{self._source} ({'rows whose device is the table name' if self._source.is_file() else 'missing'})"
        if self._table is not None:
            return f"the KernelTable given (devices: {', '.join(self._table.devices()) or 'none'})"
        return "the fits given"

    def _check_calibration(self, design: Design, fits: dict, name: str) -> None:
        """A GPU design names a calibration table that none of this model's sources holds (or
        none of its rows of the design's software stack): an InputError naming the table and
        where it was looked for, unless the roofline fallback was asked for
        (``allow_uncalibrated``: an InputWarning says so once per table)."""
        stack = design_stacks(design)
        if fits or self.measured_for(name, stack):
            return
        where = self._searched()
        if stack is not None and (self._given_fits is not None or self.measured_for(name)):
            stacks = sorted({r.stack or "unknown" for r in self._device_rows(name)})
            where += f"; it has no rows of stack {stack!r} (stacks there: {', '.join(stacks) or 'none'})"
        if not self.allow_uncalibrated:
            raise InputError(None, f"designs.{design.name}.gpu.calibration",
                             f"no calibration table {name!r} found; looked in {where}. Give the table (set "
                             "$MARSSIM_TRACES to a directory with calibration/), or pass --allow-uncalibrated to time "
                             "this design by the analytical GPU roofline")
        if name.lower() not in self._warned:
            self._warned.add(name.lower())
            warn_input(None, f"no calibration table {name!r} for design {design.name!r} (looked in {where}); its "
                             "ops are timed by the analytical GPU roofline, as asked")

    def _gpu_table(self, design: Design) -> GpuTable:
        name = design.gpu.calibration
        tables = self._design_tables(name, design_peaks(design), design_stacks(design)) if name else None
        fits = tables.fits if tables is not None else {}
        if name and self._calibrated and not fits and not tables.measured:
            self._check_calibration(design, fits, name)
        measured = tables.measured if name and self.measured else None
        corrections = {key: f.correction for key, f in fits.items() if f.correction is not None} \
            if self.correction else None
        grid = tables.attention if name and self.measured else None
        return GpuTable(design, {key: f.params for key, f in fits.items()}, measured=measured,
                        corrections=corrections, best_rates={key: f.best_rate for key, f in fits.items()},
                        attention=grid, rescale=self._rescale(design, grid))

    @staticmethod
    def _rescale(design: Design, grid: AttentionGrid | None) -> AttentionRescale | None:
        """The kernel set that times ``design``'s causal prompt attention kernels
        (``gpu.attention_kernels``, :mod:`marssim.cost.attention_kernels`), None without one or
        without a measured grid to rescale (measured kernels switched off, no table); InputError
        for a set measured on a GPU of another generation than the design's table."""
        name = design.gpu.attention_kernels
        if not name or grid is None:
            return None
        kernels = load_kernel_set(name)
        if generation_of(kernels.gpu) != generation_of(design.gpu.calibration or ""):
            raise InputError(None, f"designs.{design.name}.gpu.attention_kernels",
                             f"kernel set {name!r} was measured on {kernels.gpu} ({generation_of(kernels.gpu)}); "
                             f"expected a set of the design's GPU generation ({design.gpu.calibration}: "
                             f"{generation_of(design.gpu.calibration or '') or 'unknown'})")
        return AttentionRescale(kernels, grid, design.gpu.sms)

    def _design_tables(self, name: str, peaks: dict[str, float], stack) -> DesignTables:
        """What a GPU design with table ``name`` reads from this model's tables: its fits, its
        measured medians by shape code and its fused attention grid. Tables read from files are
        kept on disk (:func:`.fitcache.design_tables_key`: their bytes, the design's table, stack
        and peaks, this model's tunings) and shared in-process, so that a later process reads
        neither the tables' rows nor their fits."""
        files = _table_files(self._source) if self._source is not None and self._given_fits is None else None
        shared = (files, name.lower(), tuple(sorted(peaks.items())), stack, self.tuning) if files else None
        if shared is not None:
            hit = _SHARED_TABLES.get(shared)
            if hit is not None:
                return hit
        disk = fitcache.design_tables_key(self._source, name.lower(), peaks, stack, self.tuning) \
            if shared is not None else None
        got = fitcache.load_design_tables(disk) if disk is not None else None
        if got is None:
            fits = self.fits_for(name, peaks, stack)
            rows = self.measured_for(name, stack)
            got = DesignTables(fits, {code: r.median_s for code, r in rows.items()},
                               self._attention_grid(name, stack))
            if disk is not None:
                fitcache.store_design_tables(disk, got)
        if shared is not None:
            _SHARED_TABLES[shared] = got
        return got

    def _attention_grid(self, name: str, stack) -> AttentionGrid:
        """The measured fused attention kernels (with their heads) a design with table ``name``
        and stack(s) ``stack`` interpolates between (:mod:`marssim.cost.attention_grid`),
        built once per table and stack."""
        key = (name.lower(), stack)
        grid = self._grids.get(key)
        if grid is None:
            grid = self._grids[key] = AttentionGrid(row_entries(self.measured_for(name, stack).values()))
        return grid

    def measured_time(self, op: Op, design: Design) -> float | None:
        """The measured median (s) the table holds for ``op``'s kernel shape on the GPU-class
        ``design``, or None (no table row for the shape, or not a GPU design). Independent of
        the ``measured`` switch."""
        if design.dataflow != "gpu" or not design.gpu.calibration:
            return None
        row = _lookup(self.measured_for(design.gpu.calibration, design_stacks(design)), op_features(op))
        return None if row is None else row.median_s

    def curve_cost(self, op: Op, design: Design) -> OpCost:
        """``op`` on ``design`` by the fitted (or analytical) curve alone, measured shapes and
        the residual correction ignored; for comparing the curve with the measurement. Not
        memoised."""
        did = self._did(design)
        return self._compute(op_features(op), self._dparams[did], use_measured=False)

    def coverage(self, design: Design, dtypes: Sequence[str] = ("fp16", "bf16")) -> dict[str, str]:
        """For a GPU-class design: per kernel kind, which model times it for ``dtypes``
        (``fitted``, with the fitted rows' dtype and tuning, points and error, or ``gpu-roofline``;
        for attention, how many measured fused kernels interpolate the shapes between them). Empty
        for other designs."""
        if design.dataflow != "gpu":
            return {}
        name, stack = design.gpu.calibration, design_stacks(design)
        fits = self.fits_for(name, design_peaks(design), stack) if name else {}
        shapes: dict[tuple[int, int], int] = {}
        grid = AttentionGrid()
        gemm = None
        if name and self.measured:
            measured = self.measured_for(name, stack)
            for code in measured:
                shapes[code[:2]] = shapes.get(code[:2], 0) + 1
            grid = self._attention_grid(name, stack)
            gemm = grid_from_measured({code: r.median_s for code, r in measured.items()})
        out = {}
        for ki, kind in enumerate(KERNEL_KINDS):
            parts = []
            for dt in dtypes:
                f = fits.get((kind, dt))
                n_measured = shapes.get((ki, DTYPES.index(dt)), 0)
                measured = f", {n_measured} measured shapes used as measured" if n_measured else ""
                if f is None:
                    parts.append(f"{dt}: gpu-roofline (no calibration data{measured})"
                                 if not n_measured else f"{dt}: gpu-roofline (too few rows to fit{measured})")
                else:
                    parts.append(f"{dt}: fitted ({f.dtype} {f.tuning} rows, {f.n_points} points, "
                                 f"rms {100 * f.rms_log_error:.2g} %{measured})")
            if kind == "attention" and grid:
                parts.append(f"fused attention interpolated between {len(grid):,} measured kernels with their heads")
            if kind == "gemm" and gemm:
                parts.append(f"shapes between {len(gemm):,} measured GEMMs of a grid interpolated")
            out[kind] = "; ".join(parts)
        return out

    # ------------------------------------------------------------------ scalar path
    def op_cost(self, op: Op, design: Design) -> OpCost:
        """Time (s), energy (J) and breakdown of ``op`` (or a shard of it) on ``design``."""
        entry = self._op_ids.get(id(op))
        fid = entry[1] if entry is not None and entry[0] is op else self._fid(op)
        entry = self._design_ids.get(id(design))
        did = entry[1] if entry is not None and entry[0] is design else self._did(design)
        key = (fid, did)
        cost = self._memo.get(key)
        if cost is None:
            cost = self._compute(self._rows[fid], self._dparams[did])
            if len(self._memo) >= MAX_MEMO:
                self._memo.clear()
                if len(self._fid_by_op) >= MAX_SHAPES:
                    self._reset()
                    return cost
            self._memo[key] = cost
        return cost

    def op_time(self, op: Op, design: Design) -> float:
        """Seconds ``op`` takes on ``design``."""
        return self.op_cost(op, design).time

    @staticmethod
    def _compute(x: tuple[int, ...], d: DesignParams, use_measured: bool = True) -> OpCost:
        cls = x[F_CLASS]
        if cls == CLASS_NONE:
            return _ZERO
        code = d.code
        macs = x[F_MACS]
        if code is Dataflow.GPU:
            kernel, dt = x[F_KERNEL], x[F_DTYPE]
            if cls == CLASS_GEMM and d.gpu.missing:
                d.gpu.check_dtype(dt)
            p = d.gpu.rows[kernel][dt]
            t, c, m, cyc, sram_b, dram_b = (gpu_gemm if cls == CLASS_GEMM else gpu_stream)(x, p, max, min)
            sram_rd, sram_wr, dram_rd, dram_wr = 0.0, 0.0, float(dram_b), 0.0
            model = d.gpu.models[kernel][dt]
            if use_measured:
                t_stack = d.gpu.rescale.seconds(x) if d.gpu.rescale is not None else None
                t_measured = _lookup(d.gpu.measured, x) if d.gpu.measured and t_stack is None else None
                grid = d.gpu.attention if t_measured is None and t_stack is None else None
                t_between = None if grid is None else op_seconds(grid, x, extrapolate=False)
                if t_between is None and cls == CLASS_GEMM and d.gpu.gemm is not None and t_measured is None \
                        and t_stack is None:  # a linear layer's GEMM between measured ones
                    t_between = gemm_seconds(d.gpu.gemm, x)
                t_beyond = None if grid is None or t_between is not None else op_seconds(grid, x)
                t_derived = None if t_stack is not None or t_measured is not None or t_between is not None \
                    or t_beyond is not None else _derived(d.gpu, x)
                if t_stack is not None:  # a training stack's attention kernel, from its published rates
                    t, model = t_stack, "rescaled"
                elif t_measured is not None:  # the curve's compute/memory split is kept as the breakdown
                    t, model = t_measured, "measured"
                elif t_between is not None:  # between measured fused attention kernels
                    t, model = t_between, "interpolated"
                elif t_beyond is not None:  # past the longest measured keys of a line at its plateau
                    t, model = t_beyond, "extrapolated"
                elif t_derived is not None:  # a fused attention backward from its measured forward
                    t, model = t_derived, "derived"
                elif d.gpu.any_correction and d.gpu.corrections[kernel][dt] is not None:
                    t = t * float(d.gpu.correction_factors([x])[0])
            if cls == CLASS_GEMM and model not in MEASURED_MODELS:  # no curve past the best rate measured
                t = max(t, x[F_FLOPS] / d.gpu.ceilings[kernel, dt])
            peak = 0.5 * d.gpu.peaks[dt]
        else:
            if cls == CLASS_STREAM:
                t, c, m, cyc, sram_rd, sram_wr, dram_rd, dram_wr = stream_op(x, d, max)
                model = "bandwidth"
            elif code.systolic:
                t, c, m, cyc, sram_rd, sram_wr, dram_rd, dram_wr = systolic_gemm(x, d, code, max, min)
                model = _MODEL_NAMES[code]
            else:
                t, c, m, cyc, sram_rd, sram_wr, dram_rd, dram_wr = _LOOPMAP[code](x, d, max, min)
                model = _MODEL_NAMES[code]
            peak = d.peak_macs
        e = d.energy
        if e is None:
            energy = e_compute = e_sram = e_dram = math.nan
        else:
            arith = macs * e[0] if cls == CLASS_GEMM else x[F_FLOPS] * (0.5 * e[0])
            e_compute = arith + e[5] * t
            e_sram = sram_rd * e[1] + sram_wr * e[2]
            e_dram = dram_rd * e[3] + dram_wr * e[4]
            energy = e_compute + e_sram + e_dram
        util = macs / (t * peak) if t > 0 else 0.0
        return OpCost(t, energy, c, m, float(cyc), util, model, float(dram_rd + dram_wr), float(sram_rd + sram_wr),
                      e_compute, e_sram, e_dram)

    # ------------------------------------------------------------------ vectorised path
    def _feature_matrix(self) -> np.ndarray:
        """The interned feature tuples as columns ``[feature, shape id]``, grown in place."""
        n_done, n = self._matrix_n, len(self._rows)
        if n_done != n:
            if n > self._matrix.shape[1]:
                grown = np.zeros((N_FEATURES, max(n, 2 * self._matrix.shape[1], 1024)), dtype=np.int64)
                grown[:, :n_done] = self._matrix[:, :n_done]
                self._matrix = grown
            self._matrix[:, n_done:n] = np.array(self._rows[n_done:n], dtype=np.int64).reshape(-1, N_FEATURES).T
            self._matrix_n = n
        return self._matrix

    def _times_on(self, did: int, fids: np.ndarray) -> np.ndarray:
        """Seconds of the interned ops ``fids`` on design ``did`` (numpy, same formulas)."""
        d = self._dparams[did]
        matrix = self._feature_matrix()
        out = np.zeros(len(fids), dtype=np.float64)
        cls = matrix[F_CLASS][fids]
        code = d.code
        for value in (CLASS_GEMM, CLASS_STREAM):
            mask = cls == value
            n_sel = int(np.count_nonzero(mask))
            if n_sel == 0:
                continue
            whole = n_sel == len(fids)
            x = _Columns(matrix, fids if whole else fids[mask])
            if code is Dataflow.GPU:
                kernel, dt = x[F_KERNEL], x[F_DTYPE]
                p = tuple(a[kernel, dt] for a in d.gpu.arrays)
                t = (gpu_gemm if value == CLASS_GEMM else gpu_stream)(x, p, np.maximum, np.minimum)[0]
            elif value == CLASS_STREAM:
                t = stream_op(x, d, np.maximum)[0]
            elif code.systolic:
                t = systolic_gemm(x, d, code, np.maximum, np.minimum)[0]
            else:
                t = _LOOPMAP[code](x, d, np.maximum, np.minimum)[0]
            if whole:
                out[:] = t
            else:
                out[mask] = t
        if code is Dataflow.GPU and d.gpu.any_correction:
            out *= self._factor_column(did)[fids]
        if code is Dataflow.GPU:  # no curve past the best throughput measured (measured times replace it below)
            gemm = cls == CLASS_GEMM
            if d.gpu.missing and gemm.any():
                for dt in np.unique(matrix[F_DTYPE][fids][gemm]).tolist():
                    d.gpu.check_dtype(int(dt))
            if gemm.any():
                floor = matrix[F_FLOPS][fids] / d.gpu.ceilings[matrix[F_KERNEL][fids], matrix[F_DTYPE][fids]]
                out[gemm] = np.maximum(out[gemm], floor[gemm])
        if code is Dataflow.GPU and (d.gpu.measured or d.gpu.attention is not None):
            derived = self._derived_column(did)[fids]
            hit = ~np.isnan(derived)
            out[hit] = derived[hit]
        if code is Dataflow.GPU and (d.gpu.attention is not None or d.gpu.gemm is not None):
            between = self._between_column(did)[fids]
            hit = ~np.isnan(between)
            out[hit] = between[hit]
        if code is Dataflow.GPU and d.gpu.measured:
            measured = self._measured_column(did)[fids]
            hit = ~np.isnan(measured)
            out[hit] = measured[hit]
        if code is Dataflow.GPU and d.gpu.rescale is not None:
            rescaled = self._rescaled_column(did)[fids]
            hit = ~np.isnan(rescaled)
            out[hit] = rescaled[hit]
        return out

    def _rescaled_column(self, did: int) -> np.ndarray:
        """Seconds of every interned causal prompt attention shape on GPU design ``did`` as its
        kernel set times it (NaN: a shape the set does not time), extended as shapes are
        interned."""
        col = self._rescaled_cols.get(did)
        n = len(self._rows)
        done = 0 if col is None else len(col)
        if done < n:
            rescale = self._dparams[did].gpu.rescale
            new = np.array([_or_nan(rescale.seconds(x)) for x in self._rows[done:n]], dtype=np.float64)
            col = new if col is None else np.concatenate([col, new])
            self._rescaled_cols[did] = col
        return col

    def _between_column(self, did: int) -> np.ndarray:
        """Interpolated seconds of every interned shape on GPU design ``did`` (:func:`_between`;
        NaN: neither a fused attention kernel nor a linear layer's GEMM the design's measured grids
        interpolate; measured shapes are replaced by their rows afterwards), extended as shapes
        are interned."""
        col = self._between_cols.get(did)
        n = len(self._rows)
        done = 0 if col is None else len(col)
        if done < n:
            gpu = self._dparams[did].gpu
            new = np.array([_or_nan(_between(gpu, x)) for x in self._rows[done:n]], dtype=np.float64)
            col = new if col is None else np.concatenate([col, new])
            self._between_cols[did] = col
        return col

    def _derived_column(self, did: int) -> np.ndarray:
        """Seconds of every interned fused attention backward shape on GPU design ``did`` derived
        from its measured or interpolated forward twin (NaN: not such a shape, or no forward
        time; measured and interpolated shapes are replaced afterwards), extended as shapes are
        interned."""
        col = self._derived_cols.get(did)
        n = len(self._rows)
        done = 0 if col is None else len(col)
        if done < n:
            gpu = self._dparams[did].gpu
            new = np.array([_or_nan(_derived(gpu, x)) for x in self._rows[done:n]], dtype=np.float64)
            col = new if col is None else np.concatenate([col, new])
            self._derived_cols[did] = col
        return col

    def _measured_column(self, did: int) -> np.ndarray:
        """Measured seconds of every interned shape on GPU design ``did`` (NaN: not measured),
        extended as shapes are interned."""
        col = self._measured_cols.get(did)
        n = len(self._rows)
        done = 0 if col is None else len(col)
        if done < n:
            table = self._dparams[did].gpu.measured
            new = np.array([_lookup(table, x, np.nan) for x in self._rows[done:n]], dtype=np.float64)
            col = new if col is None else np.concatenate([col, new])
            self._measured_cols[did] = col
        return col

    def _factor_column(self, did: int) -> np.ndarray:
        """Residual-correction multipliers of every interned shape on GPU design ``did`` (1.0:
        none applies), extended as shapes are interned."""
        col = self._factor_cols.get(did)
        n = len(self._rows)
        done = 0 if col is None else len(col)
        if done < n:
            new = self._dparams[did].gpu.correction_factors(self._rows[done:n])
            col = new if col is None else np.concatenate([col, new])
            self._factor_cols[did] = col
        return col

    @staticmethod
    def _intern(objs: Sequence, resolve) -> tuple[np.ndarray, np.ndarray]:
        """``(codes, ids)``: ``ids`` the distinct interned ids among ``objs``, ``codes[i]`` the
        index into ``ids`` of ``objs[i]``; ``resolve`` runs once per distinct object (by identity)."""
        import pandas as pd

        if not len(objs):
            return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
        addrs = np.fromiter(map(id, objs), dtype=np.uint64, count=len(objs))
        codes, uniques = pd.factorize(addrs)
        any_index = np.empty(len(uniques), dtype=np.int64)
        any_index[codes] = np.arange(len(objs))  # equal addresses are the same (live) object
        resolved = np.fromiter((resolve(objs[i]) for i in any_index.tolist()), dtype=np.int64,
                               count=len(any_index))
        codes2, ids = pd.factorize(resolved)
        return codes2[codes], ids

    def shape_ids(self, ops: Sequence[Op]) -> np.ndarray:
        """Interned shape ids of ``ops`` (int64), for :meth:`times`. Ops of equal shape share an id.
        Ids stay valid until :meth:`clear_cache` (or more than ``MAX_SHAPES`` ops were seen)."""
        codes, ids = self._intern(ops, self._fid)
        return ids[codes]

    def design_ids(self, designs: Sequence[Design]) -> np.ndarray:
        """Interned ids of ``designs`` (int64), for :meth:`times`."""
        codes, ids = self._intern(designs, self._did)
        return ids[codes]

    def times(self, shape_ids: np.ndarray, design_ids: np.ndarray) -> np.ndarray:
        """Seconds of each pair ``(shape_ids[i], design_ids[i])``: the array-only core of
        :meth:`op_times` (no Python work per pair). Evaluates each distinct pair once when the
        distinct shapes x distinct designs are fewer than the pairs, else per design."""
        import pandas as pd

        shape_ids = np.asarray(shape_ids, dtype=np.int64)
        design_ids = np.asarray(design_ids, dtype=np.int64)
        if len(design_ids) != len(shape_ids):
            raise ValueError(f"times needs as many design ids as shape ids, got {len(design_ids)} and "
                             f"{len(shape_ids)}")
        if not len(shape_ids):
            return np.zeros(0)
        if (int(shape_ids.min()) < 0 or int(shape_ids.max()) >= len(self._rows) or int(design_ids.min()) < 0
                or int(design_ids.max()) >= len(self._dparams)):
            raise ValueError("unknown shape or design id (ids from another model, or from before clear_cache())")
        fpos, fids = pd.factorize(shape_ids)
        dpos, dids = pd.factorize(design_ids)
        return self._pairs(fpos, fids, dpos, dids)

    def _pairs(self, fpos: np.ndarray, fids: np.ndarray, dpos: np.ndarray, dids: np.ndarray) -> np.ndarray:
        """Seconds of pairs ``(fids[fpos[i]], dids[dpos[i]])`` (distinct ids in ``fids``, ``dids``)."""
        n = len(fpos)
        if len(fids) * len(dids) <= n:
            return self._cross(fids, dids)[fpos, dpos]
        shapes = fids[fpos]
        out = np.empty(n, dtype=np.float64)
        if len(dids) == 1:
            out[:] = self._times_on(int(dids[0]), shapes)
            return out
        if len(dids) <= 64:
            for j, did in enumerate(dids.tolist()):
                idx = np.flatnonzero(dpos == j)
                out[idx] = self._times_on(did, shapes[idx])
            return out
        order = np.argsort(dpos, kind="stable")
        bounds = np.searchsorted(dpos[order], np.arange(len(dids) + 1))
        for j, did in enumerate(dids.tolist()):
            idx = order[bounds[j]:bounds[j + 1]]
            out[idx] = self._times_on(did, shapes[idx])
        return out

    def op_times(self, ops: Sequence[Op], designs: Sequence[Design]) -> np.ndarray:
        """Seconds of each pair ``(ops[i], designs[i])``, vectorised; equal to :meth:`op_time`
        bit for bit (see :meth:`times`)."""
        if len(designs) != len(ops):
            raise ValueError(f"op_times needs as many designs as ops, got {len(designs)} and {len(ops)}")
        if not len(ops):
            return np.zeros(0)
        if len(self._fid_by_op) >= MAX_SHAPES:
            self._reset()
        fpos, fids = self._intern(ops, self._fid)
        dpos, dids = self._intern(designs, self._did)
        return self._pairs(fpos, fids, dpos, dids)

    def _cross(self, fids: np.ndarray, dids: np.ndarray) -> np.ndarray:
        table = np.empty((len(fids), len(dids)), dtype=np.float64)
        for j, did in enumerate(dids.tolist()):
            table[:, j] = self._times_on(did, fids)
        return table

    def op_time_table(self, ops: Sequence[Op], designs: Sequence[Design]) -> np.ndarray:
        """Seconds of every op on every design: an array ``[len(ops), len(designs)]``."""
        if not len(ops) or not len(designs):
            return np.zeros((len(ops), len(designs)))
        fpos, fids = self._intern(ops, self._fid)
        dpos, dids = self._intern(designs, self._did)
        return self._cross(fids, dids)[np.ix_(fpos, dpos)]

    def __repr__(self) -> str:
        src = self._source or ("table" if self._table is not None else "fits" if self._given_fits else None)
        return f"{type(self).__name__}(calibration={src!s})"


def _or_nan(v: float | None) -> float:
    return math.nan if v is None else v


def _measured_code(x: tuple[int, ...]) -> tuple:
    """The shape code of feature tuple ``x`` in :attr:`GpuTable.measured`
    (:func:`~marssim.cost.calibrated.shape_key` with index codes; a convolution's with its
    geometry, a fused attention kernel's with its heads; the kernel's phase and fused attention
    backend)."""
    if x[F_CLASS] == CLASS_GEMM:
        return (x[F_KERNEL], x[F_DTYPE], x[F_G], x[F_M], x[F_NN], x[F_KK], 0, 0,
                conv_geometry_key(x) or attention_geometry_key(x), x[F_PHASE], x[F_BACKEND])
    return (x[F_KERNEL], x[F_DTYPE], 0, 0, 0, 0, x[F_FLOPS], x[F_TRAFFIC], (), x[F_PHASE], x[F_BACKEND])


MEASURED_MODELS = ("measured", "interpolated", "extrapolated", "derived", "rescaled")
"""The :attr:`OpCost.model` values of a GPU kernel timed from measured kernels rather than a curve."""


def _between(gpu, x: tuple[int, ...]) -> float | None:
    """Seconds of op ``x`` between measured kernels: a fused attention kernel in the design's
    attention grid (extended past a line's end where :mod:`.attention_grid` allows), else a linear
    layer's GEMM in its GEMM grid; None for neither."""
    t = op_seconds(gpu.attention, x) if gpu.attention is not None else None
    if t is None and gpu.gemm is not None and x[F_CLASS] == CLASS_GEMM:
        t = gemm_seconds(gpu.gemm, x)
    return t


def _derived(gpu, x: tuple[int, ...]) -> float | None:
    """Seconds of the fused attention backward op ``x`` from its forward twin's measured or
    interpolated time (:mod:`marssim.cost.attention_backward`), None for any other op or where
    the twin has neither."""
    twin = forward_twin(x)
    if twin is None:
        return None
    t = _lookup(gpu.measured, twin) if gpu.measured else None
    if t is None and gpu.attention is not None:
        t = op_seconds(gpu.attention, twin)
    return None if t is None else t * twin_ratio(x)


def _lookup(measured: dict, x: tuple[int, ...], default=None):
    """``measured``'s entry for feature tuple ``x``, in the order of
    :func:`~marssim.cost.calibrated.lookup_keys`: the row of its own shape code; for a
    convolution, a row of its GEMM shape without geometry (tables measured before the geometry
    columns); for a gradient or other non-forward kernel that is not a fused attention kernel,
    the same of phase ``fwd``; else ``default``."""
    code = _measured_code(x)
    got = measured.get(code)
    if got is None:
        codes = [code]
        if code[8]:
            codes.append((*code[:8], (), *code[9:]))
            got = measured.get(codes[-1])
        if got is None and code[9] and not code[10]:  # phase index 0 is fwd; a fused kernel keeps its phase
            for c in codes:
                got = measured.get((*c[:9], 0, c[10]))
                if got is not None:
                    break
    return default if got is None else got


class SystolicCost(DataflowCost):
    """Systolic arrays only (os, ws, is): SCALE-Sim fold formulas with a roofline floor."""

    dataflows = SYSTOLIC_DATAFLOWS

    def __init__(self) -> None:
        super().__init__(calibration=None)


class LoopMapCost(DataflowCost):
    """Eyeriss row-stationary, NVDLA-like and ShiDianNao-like arrays only."""

    dataflows = ("rs", "nvdla", "shidiannao")

    def __init__(self) -> None:
        super().__init__(calibration=None)


class GpuRooflineCost(DataflowCost):
    """GPU-class designs only, analytical: roofline times the default efficiency curves."""

    dataflows = ("gpu",)

    def __init__(self) -> None:
        super().__init__(calibration=None)


class CalibratedCost(DataflowCost):
    """GPU-class designs only, from measured kernel tables (a path, a KernelTable or fits);
    kinds without data fall back to the analytical curve (``OpCost.model == "gpu-roofline"``)."""

    dataflows = ("gpu",)

    def __init__(self, calibration: str | Path | KernelTable | Mapping[FitKey, KernelFit], *,
                 tuning: Sequence[str] = tuple(reversed(TUNINGS)), measured: bool = True,
                 correction: bool = True, allow_uncalibrated: bool = False) -> None:
        if calibration is None:
            raise ValueError("CalibratedCost needs a calibration table, directory or fits")
        super().__init__(calibration=calibration, tuning=tuning, measured=measured, correction=correction,
                         allow_uncalibrated=allow_uncalibrated)
