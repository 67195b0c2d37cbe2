"""Cost models: how long an op (or a shard of it) takes on an accelerator design, and its energy.

One interface (:class:`CostModel`: ``op_cost``, ``op_time``, ``op_times``) and one engine,
:class:`DataflowCost`, that dispatches on ``design.dataflow``: SCALE-Sim fold formulas for
systolic arrays (:mod:`.systolic`), loop-mapping models of Eyeriss, NVDLA and ShiDianNao
(:mod:`.loopmap`), a roofline with shape-dependent efficiency curves for GPUs (:mod:`.gpu`)
calibrated from measured kernel tables where present (:mod:`.calibrated`), and bandwidth-bound
streaming for non-GEMM ops (:mod:`.bandwidth`). The restricted classes (:class:`SystolicCost`,
:class:`LoopMapCost`, :class:`GpuRooflineCost`, :class:`CalibratedCost`) accept only their own
dataflows.
"""

from __future__ import annotations

from .base import CostModel, OpCost
from .calibrated import (
    KernelFit, KernelTable, KernelTiming, calibration_dir, fit, fit_group, holdout_errors, load_table, load_tables,
    predict, traces_dir,
)
from .gpu import DEFAULT_EFFICIENCY, CurveParams, KindEfficiency
from .model import CalibratedCost, DataflowCost, GpuRooflineCost, LoopMapCost, SystolicCost
from .systolic import fold_cycles

__all__ = [
    "CostModel", "OpCost", "default_cost_model", "DataflowCost", "SystolicCost", "LoopMapCost", "GpuRooflineCost",
    "CalibratedCost", "KernelFit", "KernelTable", "KernelTiming", "CurveParams", "KindEfficiency",
    "DEFAULT_EFFICIENCY", "fit", "fit_group", "predict", "holdout_errors", "load_table", "load_tables",
    "traces_dir", "calibration_dir", "fold_cycles",
]


def default_cost_model(*, allow_uncalibrated: bool = False) -> DataflowCost:
    """The cost model marssim uses unless told otherwise: :class:`DataflowCost` for every
    dataflow, GPU designs calibrated from the tables in :func:`calibration_dir`
    (``$MARSSIM_TRACES/calibration``, else the tables that ship with marssim) whose device matches
    their ``gpu.calibration``. A design that names a table found nowhere is an error, unless
    ``allow_uncalibrated`` (then the analytical GPU roofline times it, with a warning). Picklable."""
    return DataflowCost(calibration=calibration_dir(), allow_uncalibrated=allow_uncalibrated)
