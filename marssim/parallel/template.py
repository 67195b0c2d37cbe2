"""A unit template: the tasks of one unit (chunk, micro-batch-independent forward, backward or
optimizer pass) of one representative GPU, as the builder (:mod:`.builder`) records them row by
row and then holds them as arrays (:func:`freeze`), with its references to other units grouped by
the unit they read (:func:`template_edges`) for the program (:mod:`.program`).

Units: seconds, bytes, FLOPs, joules (the TaskGraph's columns).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from marssim.taskgraph import Collective

__all__ = ["AFTER_PREVIOUS", "COLUMNS", "LAST", "LAST_BACKWARD", "SAME", "Ref", "Steps", "Template", "column_array",
           "freeze", "template_edges"]

SAME = "same"
"""A reference to the instance of the same micro-batch as the reader's."""
LAST = "last"
"""A reference to the instance of the unit's last micro-batch (the optimizer reading the backward)."""
LAST_BACKWARD = ("last-backward", 0)
"""The unit key of a reference to the reader's GPU's latest instance with a backward kernel before it."""


class Ref(NamedTuple):
    """A task a row waits for: task ``rel`` (counted from the unit's first) of the instance of unit
    ``unit`` (chunk, direction) of representative GPU ``rep``, of the reader's micro-batch
    (``mode`` :data:`SAME`) or of the unit's last one (:data:`LAST`)."""

    rep: int
    unit: tuple
    rel: int
    mode: str

    def as_mode(self, mode: str) -> Ref:
        """This reference read as ``mode``; a :data:`LAST` one stays so."""
        return self if self.mode == LAST or self.mode == mode else Ref(self.rep, self.unit, self.rel, mode)

    def at_last(self) -> Ref:
        """This reference read at the unit's last micro-batch."""
        return Ref(self.rep, self.unit, self.rel, LAST)


class Steps(NamedTuple):
    """The references of a ring's ``count`` repeated steps: row ``r`` of them waits for row
    ``r - 1`` of the same unit of representative ``rep`` (expanded by :func:`template_edges`)."""

    count: int
    rep: int
    unit: tuple

AFTER_PREVIOUS = ("previous row",)  # a template row's predecessors: the row before it alone (a ring's repeated steps)


@dataclass
class Template:
    """The tasks of one unit of one representative GPU, ids relative to the unit's first task."""

    cols: dict[str, list] = field(default_factory=lambda: defaultdict(list))
    preds: list[list[int]] = field(default_factory=list)
    ext: list[tuple[int, Ref | Steps]] = field(default_factory=list)  # (task, reference outside the unit)
    colls: list[Collective] = field(default_factory=list)
    produced: dict[str, tuple[str, tuple]] = field(default_factory=dict)  # tensor -> (layout, refs)
    converted: dict[tuple[str, str], tuple] = field(default_factory=dict)
    kernels: dict[int, int] = field(default_factory=dict)  # compute task -> kernels it launches
    send_wait: int = -1  # the task after its last kernel that waits for its blocking pipeline sends
    last_compute: int = -1
    first_compute: int = -1
    prev_compute: int = -1  # the kernel before the last one
    arrays: dict[str, np.ndarray] | None = None
    n_rows: int = 0  # once built (its rows then held as arrays, see freeze)
    runs: list[tuple[int, int]] = field(default_factory=list)  # (first, count): rows copying the row before first
    # coupled ring transfers (lowered with coupled rings): (row, the representative whose same row
    # feeds its steps, bytes per step)
    coupled: list[tuple[int, int, float]] = field(default_factory=list)

    def __len__(self) -> int:
        return self.n_rows if self.preds is None else len(self.preds)


COLUMNS = {"kind": np.int8, "device": np.int32, "duration": np.float64, "src": np.int32, "dst": np.int32,
           "nbytes": np.float64, "route": np.int32, "flops": np.float64, "energy": np.float64, "mem_node": np.int32,
           "mem_bytes": np.float64, "op": np.int32, "collective": np.int32, "steps": np.int32}
"""A template's columns and their dtypes (the TaskGraph's)."""


def _segments(n: int, runs: list[tuple[int, int]]):
    """Rows ``0..n`` as ``(start, stop, run)`` in order: the rows between runs (``run`` False)
    and each run of copied rows (``run`` True)."""
    at = 0
    for first, count in runs:
        if first > at:
            yield at, first, False
        yield first, first + count, True
        at = first + count
    if n > at:
        yield at, n, False


def column_array(values: list, dtype, runs: list[tuple[int, int]]) -> np.ndarray:
    """``values`` as an array of ``dtype``: a run's rows (copies of the row before it) filled
    without reading them one by one."""
    if not runs:
        return np.asarray(values, dtype=dtype)
    out = np.empty(len(values), dtype=dtype)
    for a, b, run in _segments(len(values), runs):
        out[a:b] = values[a] if run else np.asarray(values[a:b], dtype=dtype)
    return out


def freeze(tpl: Template) -> None:
    """A built template's rows as arrays only: its predecessors in the unit (per row, how many;
    the rows they are, row after row; :data:`AFTER_PREVIOUS`: the row before it, a run of them
    filled at once); the lists it was built in are dropped."""
    preds = tpl.preds
    n = len(preds)
    counts_parts, src_parts = [], []
    for a, b, run in _segments(n, tpl.runs):
        if run:
            counts_parts.append(np.ones(b - a, dtype=np.int64))
            src_parts.append(np.arange(a - 1, b - 1, dtype=np.int32))
            continue
        part = preds[a:b]
        c = np.fromiter((1 if ps is AFTER_PREVIOUS else len(ps) for ps in part), dtype=np.int64, count=b - a)
        counts_parts.append(c)
        src_parts.append(np.fromiter((p for rel, ps in enumerate(part, a)
                                      for p in ((rel - 1,) if ps is AFTER_PREVIOUS else ps)),
                                     dtype=np.int32, count=int(c.sum())))
    tpl.n_rows = n
    tpl.pred_counts = np.concatenate(counts_parts) if counts_parts else np.zeros(0, dtype=np.int64)
    tpl.edge_src = np.concatenate(src_parts) if src_parts else np.zeros(0, dtype=np.int32)  # rels in the unit
    tpl.preds = None
    tpl.cols = None
    tpl.runs = []


def template_edges(tpl: Template) -> None:
    """Precompute a template's references grouped by target unit (a ring's repeated steps, one
    :class:`Steps` entry, expanded: row ``r`` reads row ``r - 1`` of ``rep``); rows as int32, as
    the program keeps them."""
    groups: dict[tuple, tuple[list, list, list, list]] = {}  # key -> (parts, parts read, rows, rows read)
    for rel, ref in tpl.ext:
        if type(ref) is Steps:
            count, r_rep, r_key = ref
            parts, parts_read, rows, rows_read = groups.setdefault((r_rep, r_key, SAME), ([], [], [], []))
            if rows:
                parts.append(np.asarray(rows, dtype=np.int32))
                parts_read.append(np.asarray(rows_read, dtype=np.int32))
                rows.clear()
                rows_read.clear()
            steps = np.arange(rel, rel + count, dtype=np.int32)
            parts.append(steps)
            parts_read.append(steps - 1)
            continue
        r_rep, r_key, r_rel, mode = ref
        _, _, rows, rows_read = groups.setdefault((r_rep, r_key, mode), ([], [], [], []))
        rows.append(rel)
        rows_read.append(r_rel)
    out = []
    for k, (parts, parts_read, rows, rows_read) in groups.items():
        if rows:
            parts.append(np.asarray(rows, dtype=np.int32))
            parts_read.append(np.asarray(rows_read, dtype=np.int32))
        out.append((k, np.concatenate(parts), np.concatenate(parts_read)))
    tpl.ext_groups = out
