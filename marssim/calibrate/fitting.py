"""Fit a calibration table and say how well the fit predicts shapes it did not see.

:func:`fit_report` fits every ``(device, kind, dtype, tuning)`` group of a table twice with
:func:`marssim.cost.calibrated.fit_group`: once on all rows -- the parameters the cost model
uses, since :class:`marssim.cost.DataflowCost` fits the same rows the same way -- and once on
80 % of the group's distinct shapes, to predict the other 20 % (the held-out error; the
curve and its residual correction are both fitted on those 80 %, so a held-out row never
enters its own prediction; the curve's error alone is reported beside it). The held-out shapes
are chosen by the SHA-256 of each shape's GEMM-view :func:`~marssim.cost.calibrated.shape_key`
(without a convolution's geometry; the ``round(0.2 x shapes)`` smallest digests):
deterministic, independent of row order and of which other shapes the table holds, all rows
of one GEMM shape on the same side (convolutions of the same im2col GEMM too), and the same
split for a table before and after its geometry columns were filled. For convolution groups
whose rows carry their geometry the correction is fitted on it, and the same split is also
predicted with the correction by the GEMM view alone (``gemm_view_holdout``), for comparison.
(:func:`marssim.cost.calibrated.holdout_errors` holds out every n-th row in table order and
reports no p90, hence this module's own split.)

:func:`write_fit_json` writes the fitted parameters next to the table
(``traces/calibration/H100.csv`` -> ``H100.fit.json``, atomically): SI units, ``rate`` null
for streaming kinds (no compute term), with the held-out errors. :func:`format_report` prints
median, p90 and max held-out error per group and checks the targets for GEMM and conv
(median <= 10 %, p90 <= 20 %).
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from marssim.cost.calibrated import (
    FitKey, KernelFit, KernelTable, KernelTiming, fit_group, geometry_array, load_table, predict, shape_key,
)
from marssim.fsutil import atomic_file

__all__ = ["HOLDOUT_FRACTION", "TARGETS", "HoldoutStats", "GroupReport", "holdout_split", "fit_report",
           "write_fit_json", "fit_json_path", "format_report", "meets_target", "fit_table"]

HOLDOUT_FRACTION = 0.2
TARGETS = {"gemm": (0.10, 0.20), "conv": (0.10, 0.20)}
"""Held-out error targets per kind: (median, p90) of ``|predicted / measured - 1|``."""


@dataclass(frozen=True)
class HoldoutStats:
    """Errors ``|predicted / measured - 1|`` on held-out rows of a fit on the others."""

    n_fit: int
    n_held: int
    median: float
    p90: float
    max: float


@dataclass(frozen=True)
class GroupReport:
    """One group: its fit on all rows (None when too few), the held-out errors (None when the
    group is too small to hold out 20 % and still fit), and why either is missing."""

    key: FitKey
    n_rows: int
    n_shapes: int
    fit: KernelFit | None
    holdout: HoldoutStats | None
    reason: str = ""
    curve_holdout: HoldoutStats | None = None
    """The held-out errors of the curve alone (no residual correction), for comparison."""
    gemm_view_holdout: HoldoutStats | None = None
    """Convolutions with their geometry: the held-out errors with the correction fitted on the
    GEMM view alone (geometry ignored), for comparison."""
    stack: str = ""
    """The software stack whose rows (and the rows of unknown stack) the group was fitted on
    (:meth:`~marssim.cost.calibrated.KernelTable.for_stack`); ``""``: a table without stacks."""


def _digest(key: tuple) -> str:
    return hashlib.sha256(repr(key).encode()).hexdigest()


def holdout_split(rows: Sequence[KernelTiming], fraction: float = HOLDOUT_FRACTION
                  ) -> tuple[list[KernelTiming], list[KernelTiming]]:
    """``(fit rows, held-out rows)``: ``round(fraction x distinct shapes)`` shapes held out,
    those with the smallest SHA-256 digests of their shape key (see the module docstring)."""
    if not 0 < fraction < 1:
        raise ValueError("fraction must be between 0 and 1")
    keys = {}
    for r in rows:
        key = _split_key(r)
        keys.setdefault(key, _digest(key))
    n_held = int(round(fraction * len(keys)))
    held = set(sorted(keys, key=keys.get)[:n_held])
    fit_rows, held_rows = [], []
    for r in rows:
        (held_rows if _split_key(r) in held else fit_rows).append(r)
    return fit_rows, held_rows


def _split_key(r: KernelTiming) -> tuple:
    """The GEMM-view shape key the split hashes: :func:`shape_key` without its geometry
    element, ``(kind, dtype, batch, m, n, k, flops, bytes)`` as it was before tables had
    geometry columns (so the split, and the errors reported on it, stay comparable)."""
    return shape_key(r.kind, r.dtype, r.batch, r.m, r.n, r.k, r.flops, r.bytes)[:8]


def _errors(f: KernelFit, rows: Sequence[KernelTiming], corrected: bool = True) -> np.ndarray:
    pred = predict(f, f.kind, batch=[r.batch for r in rows], m=[r.m for r in rows], n=[r.n for r in rows],
                   k=[r.k for r in rows], flops=[r.flops for r in rows], nbytes=[r.bytes for r in rows],
                   corrected=corrected, geometry=geometry_array(rows))
    measured = np.array([r.median_s for r in rows])
    return np.abs(np.asarray(pred) / measured - 1.0)


def fit_report(table: KernelTable, fraction: float = HOLDOUT_FRACTION) -> list[GroupReport]:
    """Fit and held-out error of every group of ``table`` (see the module docstring), per
    software stack of the table (each with the rows of unknown stack, as a design naming the
    stack fits them), sorted by stack, device, kind, dtype and tuning."""
    out = []
    stacks = sorted(s for s in table.stacks() if s) or [""]
    for stack in stacks:
        part = table.for_stack(stack or None)
        for key, rows in sorted(part.groups().items()):
            out.append(_group_report(key, rows, fraction, stack))
    return out


def _group_report(key: FitKey, rows: Sequence[KernelTiming], fraction: float, stack: str) -> GroupReport:
    n_shapes = len({r.shape for r in rows})
    try:
        full = fit_group(rows)
    except ValueError as err:
        return GroupReport(key, len(rows), n_shapes, None, None, str(err), stack=stack)
    fit_rows, held_rows = holdout_split(rows, fraction)
    if not held_rows:
        return GroupReport(key, len(rows), n_shapes, full, None, "too few shapes to hold 20 % out", stack=stack)
    try:
        partial = fit_group(fit_rows)
    except ValueError as err:
        return GroupReport(key, len(rows), n_shapes, full, None, f"held-out fit: {err}", stack=stack)
    errors = [_errors(partial, held_rows, c) for c in (True, False)]
    if geometry_array(rows) is not None:  # the same split, corrected by the GEMM view alone
        errors.append(_errors(fit_group(fit_rows, geometry=False), held_rows))
    stats = [HoldoutStats(len(fit_rows), len(held_rows), float(np.median(e)), float(np.percentile(e, 90)),
                          float(e.max())) for e in errors]
    return GroupReport(key, len(rows), n_shapes, full, stats[0], curve_holdout=stats[1],
                       gemm_view_holdout=stats[2] if len(stats) > 2 else None, stack=stack)


def meets_target(report: GroupReport) -> bool | None:
    """Whether the group's held-out median and p90 meet :data:`TARGETS` (None: no target for its
    kind, or no held-out error)."""
    target = TARGETS.get(report.key[1])
    if target is None or report.holdout is None:
        return None
    return report.holdout.median <= target[0] and report.holdout.p90 <= target[1]


def fit_json_path(table_path: str | Path) -> Path:
    """``H100.csv`` -> ``H100.fit.json`` beside it."""
    p = Path(table_path)
    return p.with_name(p.stem + ".fit.json")


def _num(x: float) -> float | None:
    return None if math.isinf(x) else float(x)


def write_fit_json(table_path: str | Path, reports: Sequence[GroupReport], out: str | Path | None = None) -> Path:
    """Write the fitted parameters and held-out errors of ``reports`` as JSON (atomically) beside
    the table (or to ``out``); returns the path. Deterministic for the same table."""
    table_path = Path(table_path)
    path = Path(out) if out is not None else fit_json_path(table_path)
    groups = []
    for r in reports:
        device, kind, dtype, tuning = r.key
        entry: dict = {"device": device, "kind": kind, "dtype": dtype, "tuning": tuning, "rows": r.n_rows,
                       "shapes": r.n_shapes}
        if r.stack:
            entry["stack"] = r.stack
        if r.fit is None:
            entry["fit"] = None
        else:
            p = r.fit.params
            entry["params"] = {"rate_flop_per_s": _num(p.rate), "bandwidth_bytes_per_s": _num(p.bandwidth),
                               "k_half": p.k_half, "launch_s": p.launch, "sms": p.sms, "tile_m": p.tile_m,
                               "tile_n": p.tile_n, "tile_k": p.tile_k}
            entry["fit"] = {"rms_log_error": r.fit.rms_log_error, "median_rel_error": r.fit.median_rel_error,
                            "max_rel_error": r.fit.max_rel_error}
            entry["correction"] = None if r.fit.correction is None else r.fit.correction.describe()
        if r.holdout is not None:
            h = r.holdout
            entry["holdout"] = {"n_fit": h.n_fit, "n_held": h.n_held, "median_rel_error": h.median,
                                "p90_rel_error": h.p90, "max_rel_error": h.max}
            ok = meets_target(r)
            if ok is not None:
                entry["holdout"]["meets_target"] = ok
        if r.curve_holdout is not None:
            h = r.curve_holdout
            entry["holdout_curve_alone"] = {"median_rel_error": h.median, "p90_rel_error": h.p90,
                                            "max_rel_error": h.max}
        if r.gemm_view_holdout is not None:
            h = r.gemm_view_holdout
            entry["holdout_correction_by_gemm_view"] = {"median_rel_error": h.median, "p90_rel_error": h.p90,
                                                        "max_rel_error": h.max}
        if r.reason:
            entry["note"] = r.reason
        groups.append(entry)
    doc = {
        "table": table_path.name,
        "sha256": hashlib.sha256(table_path.read_bytes()).hexdigest(),
        "model": "marssim.cost.gpu efficiency curve: time = max(flops / (rate x wave x padding x K/(K+k_half)), "
                 "bytes / bandwidth) + launch (GEMM-class); bytes / bandwidth + launch (streaming); times, where "
                 "'correction' is not null, exp of the tricube-weighted mean of ln(measured / curve) over the nearest "
                 "measured shapes of the group (marssim.cost.residual); the measured shapes and their residuals are "
                 "recomputed from the table's rows, the settings are listed per group",
        "holdout": f"{HOLDOUT_FRACTION:.0%} of each group's distinct shapes, those with the smallest SHA-256 of "
                   "their shape key; errors are |predicted / measured - 1|",
        "targets": {k: {"median": v[0], "p90": v[1]} for k, v in TARGETS.items()},
        "groups": groups,
    }
    with atomic_file(path) as fh:
        json.dump(doc, fh, indent=1, allow_nan=False)
        fh.write("\n")
    return path


def _pct(x: float) -> str:
    return f"{100 * x:.3g} %"


def format_report(reports: Sequence[GroupReport]) -> str:
    """A table of the groups: rows, shapes, fit error on all rows, held-out n, median, p90, max
    and the target check for GEMM and conv."""
    from marssim.system.describe import format_table

    stacked = any(r.stack for r in reports)
    headers = ["device", *(["stack"] if stacked else []), "kind", "dtype", "tuning", "rows", "shapes", "fit rms",
               "held out", "curve median", "curve p90", "median", "p90", "max", "target"]
    lines = []
    for r in reports:
        device, kind, dtype, tuning = r.key
        fit_rms = _pct(r.fit.rms_log_error) if r.fit else "-"
        if r.holdout:
            h = r.holdout
            ok = meets_target(r)
            target = "" if ok is None else ("met" if ok else "MISSED")
            c = r.curve_holdout
            curve = [_pct(c.median), _pct(c.p90)] if c is not None else ["-", "-"]
            cells = [str(h.n_held), *curve, _pct(h.median), _pct(h.p90), _pct(h.max), target]
        else:
            cells = ["-", "-", "-", "-", "-", "-", r.reason]
        lines.append([device, *([r.stack or "-"] if stacked else []), kind, dtype, tuning, str(r.n_rows),
                      str(r.n_shapes), fit_rms, *cells])
    out = format_table(headers, lines, indent="")
    targets = "; ".join(f"{k}: median <= {100 * m:.0f} %, p90 <= {100 * p:.0f} %" for k, (m, p) in TARGETS.items())
    by_view = [r for r in reports if r.gemm_view_holdout is not None and r.holdout is not None]
    if by_view:
        out.append("")
        out.append("convolutions with their geometry: held-out error with the correction by the GEMM view alone (as "
                   "for tables without geometry) and by the geometry, on the same split:")
        rows = [[*r.key, str(r.holdout.n_held), _pct(r.gemm_view_holdout.median), _pct(r.gemm_view_holdout.p90),
                 _pct(r.gemm_view_holdout.max), _pct(r.holdout.median), _pct(r.holdout.p90), _pct(r.holdout.max)]
                for r in by_view]
        out.extend(format_table(["device", "kind", "dtype", "tuning", "held out", "GEMM view median", "p90", "max",
                                 "geometry median", "p90", "max"], rows, indent="  "))
    out.append("")
    out.append(f"held-out error: |predicted / measured - 1| on {HOLDOUT_FRACTION:.0%} of each group's shapes, fitted "
               f"on the rest (curve and residual correction alike); median/p90/max: the model (curve x local residual "
               f"correction), curve median/p90: the curve alone; fit rms: of the curve's ln(predicted / measured) on "
               f"all rows. Targets (the model): {targets}.")
    return "\n".join(out)


def fit_table(path: str | Path, out: str | Path | None = None) -> tuple[list[GroupReport], Path]:
    """Load, fit and report the table at ``path``; write its ``.fit.json``. InputError on a bad table."""
    table = load_table(path)
    reports = fit_report(table)
    return reports, write_fit_json(path, reports, out)
