"""What a calibration table covers: per kind and dtype, and per workload layer.

:func:`table_coverage` counts rows, distinct shapes, tunings and kernels per (device, kind,
dtype) and says which tunings have enough rows to be fitted; :func:`workload_coverage` says how
many of a workload's compute ops have their kernel shape in the table, i.e. are timed as
measured by the calibrated cost model (the same :func:`~marssim.cost.calibrated.shape_key`).
Pure; no GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

from marssim.cost.calibrated import GEMM_KINDS, MIN_POINTS, KernelTable, lookup_keys, shape_key
from marssim.cost.features import (
    CLASS_GEMM, CLASS_NONE, F_BACKEND, F_CLASS, F_FLOPS, F_G, F_KERNEL, F_KK, F_M, F_NN, F_PHASE, F_TRAFFIC,
    KERNEL_BACKENDS, KERNEL_KINDS, KERNEL_PHASES, conv_geometry_key, op_features,
)
from marssim.workload import Graph, Op

__all__ = ["KindCoverage", "table_coverage", "format_coverage", "op_shape_key", "measured_key", "workload_coverage"]


@dataclass(frozen=True)
class KindCoverage:
    """Rows of one (device, kind, dtype): counts, tunings (rows each), kernels (rows each),
    the tunings with enough rows to fit, and the FLOP range."""

    device: str
    kind: str
    dtype: str
    rows: int
    shapes: int
    tunings: tuple[tuple[str, int], ...]
    kernels: tuple[tuple[str, int], ...]
    fittable: tuple[str, ...]
    min_flops: float
    max_flops: float


def table_coverage(table: KernelTable) -> list[KindCoverage]:
    """Coverage per (device, kind, dtype), sorted."""
    groups: dict[tuple[str, str, str], list] = {}
    for r in table.rows:
        groups.setdefault((r.device, r.kind, r.dtype), []).append(r)
    out = []
    for (device, kind, dtype), rows in sorted(groups.items()):
        tunings = Counter(r.tuning for r in rows)
        kernels = Counter(r.kernel or "-" for r in rows)
        need = MIN_POINTS[kind in GEMM_KINDS]
        shapes = {r.shape for r in rows}
        fitted = Counter(r.tuning for r in rows if r.fitted)  # forward rows, fused attention aside
        fittable = tuple(t for t, n in sorted(fitted.items()) if n >= need)
        out.append(KindCoverage(device, kind, dtype, len(rows), len(shapes), tuple(sorted(tunings.items())),
                                tuple(sorted(kernels.items())), fittable, min(r.flops for r in rows),
                                max(r.flops for r in rows)))
    return out


def format_coverage(rows: Sequence[KindCoverage]) -> str:
    from marssim.system.describe import format_table

    lines = [[c.device, c.kind, c.dtype, str(c.rows), str(c.shapes),
              ", ".join(f"{t} {n}" for t, n in c.tunings), ", ".join(c.fittable) or "none (too few rows)",
              f"{c.min_flops:.3g}..{c.max_flops:.3g}", ", ".join(f"{k} {n}" for k, n in c.kernels)]
             for c in rows]
    return "\n".join(format_table(["device", "kind", "dtype", "rows", "shapes", "tunings (rows)", "fittable",
                                   "FLOPs", "kernels (rows)"], lines, indent="  "))


def op_shape_key(op: Op) -> tuple | None:
    """The :func:`~marssim.cost.calibrated.shape_key` the cost model looks ``op`` up by (None
    for graph inputs; a convolution's with its geometry, see
    :func:`~marssim.cost.calibrated.lookup_keys`): its type is the one the kernel computes in
    (:attr:`~marssim.workload.Op.math_dtype`: a cast's input type, an FP8 GEMM's ``fp8``)."""
    x = op_features(op)
    if x[F_CLASS] == CLASS_NONE:
        return None
    kind = KERNEL_KINDS[x[F_KERNEL]]
    tail = {"phase": KERNEL_PHASES[x[F_PHASE]], "backend": KERNEL_BACKENDS[x[F_BACKEND]]}
    if x[F_CLASS] == CLASS_GEMM:
        return shape_key(kind, op.math_dtype, x[F_G], x[F_M], x[F_NN], x[F_KK], 0, 0, conv_geometry_key(x) or None,
                         **tail)
    return shape_key(kind, op.math_dtype, 0, 0, 0, 0, x[F_FLOPS], x[F_TRAFFIC], **tail)


def measured_key(op: Op, keys: set | dict) -> tuple | None:
    """The key among ``keys`` (shape keys of measured rows) under which the cost model finds
    ``op``'s measured time, or None."""
    key = op_shape_key(op)
    if key is None:
        return None
    return next((k for k in lookup_keys(key) if k in keys), None)


def workload_coverage(table: KernelTable, graphs: Sequence[Graph]) -> list[str]:
    """One line per (workload, device): how many compute ops have a measured shape, by op kind."""
    lines = []
    for device in table.devices():
        keys = {r.shape for r in table.rows if r.device == device}
        for g in graphs:
            total: Counter = Counter()
            hit: Counter = Counter()
            for i in g.compute_ops:
                op = g.ops[i]
                total[op.kind.value] += 1
                if measured_key(op, keys) is not None:
                    hit[op.kind.value] += 1
            parts = ", ".join(f"{k} {hit[k]}/{n}" for k, n in sorted(total.items()))
            lines.append(f"  {g.spec} on {device}: {sum(hit.values())} of {sum(total.values())} compute ops have a "
                         f"measured shape ({parts})")
    return lines
