"""Recover the convolution geometry of conv rows measured before the table had ``conv_*`` columns.

The harness records in each row's ``note`` where its shape came from (``origin=`` the workload
spec, the layer, and the variant: ``resnet50:layer1.0.conv1``, ``... x4 N`` for the batch
sweep, ``... K=128`` for a swept dimension, ``... oc/4 K=64`` for a shard). For a conv row,
:func:`backfill_conv_geometry` rebuilds that layer of that workload in the row's dtype, applies
the variant (:meth:`marssim.workload.Op.with_loops`, as the grid did) and takes the rebuilt op's
geometry (:func:`marssim.cost.convgeom.conv_geometry`, the geometry the harness times) --
but only when the rebuilt op's GEMM view, FLOPs and bytes equal the row's exactly; otherwise the
row keeps empty geometry columns (and is matched by its GEMM shape, as before) and the reason
is counted. Nothing is estimated: a row is either recovered exactly or left as it was.

Which padding the harness gave a layer's kernel changed over its versions
(:data:`marssim.cost.convgeom.PADDING_RULES`): ``rule`` names the one the table was measured
with (``shard_rule`` the one for its shard rows, when these were measured by another
version). The rules agree on most layers (every one they agree on is recovered whatever the
rule); where they differ -- strided layers whose last padding row no output reads, spatial
shards -- the rule decides, and a rule under which the rebuilt kernel would not give the
layer's output (which the harness checks, so it measured no such row) leaves the row out.
:attr:`BackfillReport.rule_dependent` counts the recovered rows whose geometry the rule
decided.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from marssim.cost.calibrated import KernelTiming
from marssim.cost.convgeom import PADDING_RULES, conv_geometry
from marssim.cost.features import F_FLOPS, F_G, F_KK, F_M, F_NN, F_TRAFFIC, op_features
from marssim.workload import Graph, Op, OpKind

from .table import parse_note

__all__ = ["BackfillReport", "backfill_conv_geometry", "rebuild_origin", "is_shard_origin"]

_SCALED = re.compile(r"x(\d+) (\w+)")
_SET = re.compile(r"(?:\S+/\d+ )?(\w+)=(\d+)")


@dataclass
class BackfillReport:
    """What :func:`backfill_conv_geometry` did: conv rows seen, recovered, already carrying a
    geometry, and the others by reason."""

    conv_rows: int = 0
    recovered: int = 0
    already: int = 0
    rule_dependent: int = 0
    failed: Counter = field(default_factory=Counter)

    def describe(self) -> str:
        reasons = "; ".join(f"{why}: {n}" for why, n in self.failed.most_common())
        return (f"{self.recovered} of {self.conv_rows} conv rows recovered their geometry exactly from their "
                f"origin ({self.rule_dependent} of them by the padding rule of the harness that measured them, "
                f"the others under every rule)" + (f", {self.already} had it already" if self.already else "")
                + (f"; not recovered: {reasons}" if reasons else ""))


def rebuild_origin(origin: str, dtype: str, load: Callable[[str], Graph]) -> Op:
    """The op an ``origin`` note names (``spec:layer`` and an optional variant label), in
    ``dtype``; ``load`` returns the workload of a spec. KeyError/ValueError when the origin
    cannot be rebuilt."""
    head, _, label = origin.strip().partition(" ")
    spec, sep, layer = head.rpartition(":")
    if not sep or not spec or not layer:
        raise ValueError(f"origin {origin!r} does not name spec:layer")
    op = load(spec).op(layer)
    if op.dtype != dtype:
        op = replace(op, dtype=dtype)
    label = label.strip()
    if not label:
        return op
    m = _SCALED.fullmatch(label)
    if m:
        return op.with_loops(**{m.group(2): op.dim(m.group(2)) * int(m.group(1))})
    m = _SET.fullmatch(label)
    if m:
        return op.with_loops(**{m.group(1): int(m.group(2))})
    raise ValueError(f"unknown variant label {label!r}")


def is_shard_origin(origin: str) -> bool:
    """Whether an origin names a layer's shard (``... oc/4 K=64``), not the layer or a sweep
    variant of it."""
    label = origin.strip().partition(" ")[2]
    return bool(_SET.fullmatch(label.strip())) and "/" in label


def backfill_conv_geometry(rows: Sequence[KernelTiming], rule: str = "current",
                           shard_rule: str | None = None) -> tuple[list[KernelTiming], BackfillReport]:
    """``rows`` with the geometry of every conv row whose origin rebuilds exactly under the
    padding ``rule`` (``shard_rule`` for shard rows, default ``rule``; see the module
    docstring), and what was done. Other rows are returned unchanged, in order."""
    from marssim.workload import load_workload

    for name in (rule, shard_rule):
        if name is not None and name not in PADDING_RULES:
            raise ValueError(f"unknown padding rule {name!r}; expected one of {', '.join(PADDING_RULES)}")

    graphs: dict[str, Graph | Exception] = {}

    def load(spec: str) -> Graph:
        got = graphs.get(spec)
        if got is None:
            try:
                got = graphs[spec] = load_workload(spec)
            except Exception as err:  # noqa: BLE001 - an unknown workload is one reason among others
                got = graphs[spec] = err
        if isinstance(got, Exception):
            raise KeyError(f"workload {spec!r}")
        return got

    report = BackfillReport()
    out: list[KernelTiming] = []
    for r in rows:
        if r.kind != "conv":
            out.append(r)
            continue
        report.conv_rows += 1
        if r.conv is not None:
            report.already += 1
            out.append(r)
            continue
        origin = parse_note(r.note).get("origin")
        if not origin:
            report.failed["no origin in the note"] += 1
            out.append(r)
            continue
        try:
            op = rebuild_origin(origin, r.dtype, load)
        except (KeyError, ValueError) as err:
            report.failed[f"origin not rebuilt ({type(err).__name__})"] += 1
            out.append(r)
            continue
        if op.kind != OpKind.CONV:
            report.failed["origin is not a convolution"] += 1
            out.append(r)
            continue
        x = op_features(op)
        rebuilt = (x[F_G], x[F_M], x[F_NN], x[F_KK], x[F_FLOPS], x[F_TRAFFIC])
        if rebuilt != (r.batch, r.m, r.n, r.k, round(r.flops), round(r.bytes)):
            report.failed["rebuilt shape differs from the row's"] += 1
            out.append(r)
            continue
        used = shard_rule if shard_rule is not None and is_shard_origin(origin) else rule
        geometry = conv_geometry(op, used)
        if geometry.out_size != tuple(op.out_shape[2:]):
            report.failed[f"the {used!r} padding rule does not give the layer's output"] += 1
            out.append(r)
            continue
        report.recovered += 1
        report.rule_dependent += len({conv_geometry(op, other) for other in PADDING_RULES}) > 1
        out.append(replace(r, conv=geometry))
    return out, report
