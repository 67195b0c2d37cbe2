"""A TaskGraph held as copies of unit templates, the way a parallel lowering makes it.

A lowering of a parallel configuration repeats a few hundred *unit templates* (the tasks of one
model chunk's forward or backward pass, or of its optimizer step, on one simulated GPU) over
micro-batches: millions of tasks, thousands of distinct rows. A :class:`TaskProgram` keeps

* the templates' rows: every TaskGraph column but ``priority`` and ``micro_batch`` (a row's
  ``collective`` numbers the template's own collectives), the predecessors each row has inside
  its unit (``ipred``: rows of the same template), and the *references* it has to other units
  (``xref``: a group of the template, and the row it reads in that group's target unit);
* the *instances*: in task order, each one's template, micro-batch, first task and first
  collective, the target instance of each of its template's groups (-1: none), and the instance
  whose last kernel its first kernel follows on the same GPU (``chain_prev``).

Task ``t`` of instance ``i`` is row ``tpl_start[inst_tpl[i]] + t - inst_base[i]``; its
predecessors are its row's, shifted to the instance, then its references (group by group, each
in order), then the chain; ``priority`` is ``t``. :meth:`TaskProgram.column` and
:meth:`TaskProgram.edges` give the columns and predecessor lists of the TaskGraph it stands for
(what :class:`~marssim.taskgraph.TaskGraph` materialises on demand); :meth:`successors` the
per-row and per-instance indexes an evaluator walks instead. A lowering for the estimate may
also hold rings as :class:`CoupledSteps`: one task per GPU class whose steps are coupled to the
previous rank's, instead of one task per step. Units: as TaskGraph's.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from marssim.taskgraph import Collective

__all__ = ["TaskProgram", "ROW_COLUMNS", "Successors", "CoupledSteps"]

ROW_COLUMNS = {"kind": np.int8, "device": np.int32, "duration": np.float64, "src": np.int32, "dst": np.int32,
               "nbytes": np.float64, "route": np.int32, "flops": np.float64, "energy": np.float64,
               "mem_node": np.int32, "mem_bytes": np.float64, "op": np.int32, "collective": np.int32,
               "steps": np.int32}
"""The columns of a template row and their dtypes (the TaskGraph's)."""


@dataclass(frozen=True)
class Successors:
    """What an evaluator needs to walk successors without a per-task list: per row its successors
    in the unit (ascending rows); per instance the (instance, group) references pointing at it;
    per group the rows that read each row of its target template (``rev_ptr[rev_base[g] + r]``)."""

    isucc_ptr: np.ndarray  # int64 (rows + 1)
    isucc: np.ndarray  # int32 rels
    inc_ptr: np.ndarray  # int64 (instances + 1)
    inc_inst: np.ndarray  # int32: the referring instance
    inc_group: np.ndarray  # int32: its global group id
    rev_base: np.ndarray  # int64 (groups + 1): a group's slice of rev_ptr (target template rows + 1)
    rev_ptr: np.ndarray  # int64
    rev_rel: np.ndarray  # int32: rows of the group's template reading a target row (ascending)
    grp_rel_ptr: np.ndarray  # int64 (groups + 1): every row of a group's references (ascending; "lastkernel")
    grp_rel: np.ndarray  # int32
    chain_next: np.ndarray  # int32 (instances)


@dataclass(frozen=True, eq=False)
class CoupledSteps:
    """Ring transfers held as one task per GPU class instead of one per step (a lowering's
    ``coupled_rings``). Such a task's row says its steps (``steps``), route and bytes
    (``nbytes``: all its steps'); its step k > 0 starts once its own step k - 1 and step k - 1 of
    ``prev`` (the task of the ring's previous rank, the one sending to it) have ended; its first
    step once its predecessors have. That coupling is not a predecessor edge of the TaskGraph.
    The tasks of one ring are one *component* (a cycle through ``prev``). Arrays sorted by task."""

    task: np.ndarray  # int64: the coupled tasks, ascending
    prev: np.ndarray  # int64: the task feeding each one's steps (itself coupled)
    chunk: np.ndarray  # float64: bytes per step

    def __len__(self) -> int:
        return len(self.task)

    @cached_property
    def prev_index(self) -> np.ndarray:
        """``prev`` as positions in ``task`` (int64)."""
        at = np.searchsorted(self.task, self.prev)
        if (at >= len(self.task)).any() or (self.task[np.minimum(at, len(self.task) - 1)] != self.prev).any():
            raise ValueError("a coupled transfer is fed by a task that is not coupled")
        return at

    @cached_property
    def components(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``(component, ptr, members)``: each coupled task's component, and per component its
        positions in ``task`` (``members[ptr[c]:ptr[c + 1]]``, ascending; components numbered in
        the order of their cycles' least positions)."""
        # every task has one feeder, so a component is a cycle (with any tasks leading into it):
        # by pointer doubling, each task's least position over its 2^k feeders back, and the
        # task 2^k feeders back; once 2^k exceeds the tasks, that one is on the cycle and its
        # least position is the cycle's, which names the component
        n = len(self.task)
        least = np.arange(n, dtype=np.int64)
        back = self.prev_index.astype(np.int64)
        for _ in range(max(1, int(n).bit_length())):
            np.minimum(least, least[back], out=least)
            back = back[back]
        _, comp = np.unique(least[back], return_inverse=True)
        comp = comp.astype(np.int64)
        count = int(comp.max()) + 1 if n else 0
        ptr = np.zeros(count + 1, dtype=np.int64)
        np.cumsum(np.bincount(comp, minlength=count), out=ptr[1:])
        return comp, ptr, np.argsort(comp, kind="stable").astype(np.int64)


@dataclass(frozen=True, eq=False)
class TaskProgram:
    """See the module docstring."""

    rows: dict[str, np.ndarray]
    tpl_start: np.ndarray  # int64 (templates + 1)
    ipred_ptr: np.ndarray  # int64 (rows + 1)
    ipred: np.ndarray  # int32: rels in the same template
    xref_ptr: np.ndarray  # int64 (rows + 1)
    xref_group: np.ndarray  # int32: the group's index among its template's groups
    xref_rel: np.ndarray  # int32: the row of the target template read (ignored by "last" groups)
    grp_start: np.ndarray  # int64 (templates + 1): each template's groups (global ids)
    grp_lastkernel: np.ndarray  # bool per group: reads the target instance's last kernel
    grp_target_tpl: np.ndarray  # int32 per group: the template of its targets (-1: "lastkernel" groups)
    first_compute: np.ndarray  # int32 per template (-1: none)
    last_compute: np.ndarray  # int32 per template
    tpl_colls: tuple[tuple[Collective, ...], ...]
    inst_tpl: np.ndarray  # int32 (instances)
    inst_mb: np.ndarray  # int32
    inst_base: np.ndarray  # int64 (instances + 1)
    inst_coll: np.ndarray  # int64 (instances + 1)
    inst_gstart: np.ndarray  # int64 (instances + 1)
    target: np.ndarray  # int32: per (instance, group), the target instance or -1
    chain_prev: np.ndarray  # int32 (instances): -1 none
    coupled: CoupledSteps | None = None  # ring transfers whose steps are coupled (None: none)
    _cache: dict = field(default_factory=dict, repr=False)

    @property
    def n_tasks(self) -> int:
        return int(self.inst_base[-1])

    @property
    def n_instances(self) -> int:
        return len(self.inst_tpl)

    @cached_property
    def sizes(self) -> np.ndarray:
        """Tasks of each template."""
        return np.diff(self.tpl_start)

    @cached_property
    def used_rows(self) -> np.ndarray:
        """Whether each template row is a task (its template has an instance), bool per row."""
        return np.repeat(np.bincount(self.inst_tpl, minlength=len(self.sizes)) > 0, self.sizes)

    @cached_property
    def inst_of(self) -> np.ndarray:
        """The instance of every task (int32)."""
        return np.repeat(np.arange(self.n_instances, dtype=np.int32), self.sizes[self.inst_tpl])

    def take_rows(self, values: np.ndarray, chunk: int = 1 << 20) -> np.ndarray:
        """``values`` (one per template row) per task, built instance run by instance run (no
        whole-length index array)."""
        out = np.empty(self.n_tasks, dtype=values.dtype)
        sizes = self.sizes[self.inst_tpl]
        starts = self.tpl_start[self.inst_tpl]
        bounds = self.inst_base
        i = 0
        n_inst = self.n_instances
        while i < n_inst:
            j = int(np.searchsorted(bounds, bounds[i] + chunk, side="right")) - 1
            j = min(max(j, i + 1), n_inst)
            rows = np.repeat(starts[i:j] - bounds[i:j], sizes[i:j])
            rows += np.arange(bounds[i], bounds[j], dtype=np.int64)
            out[bounds[i]:bounds[j]] = values[rows]
            i = j
        return out

    def tasks_of_rows(self, mask: np.ndarray, instances: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The tasks whose template row ``mask`` selects (bool per row), ascending, and their rows
        (int64 each): what ``np.flatnonzero(mask[row of every task])`` gives, without a
        whole-length array. ``instances``: ascending, the only ones holding such tasks (None: any)."""
        chosen = np.flatnonzero(mask)  # ascending: grouped by template
        count = np.bincount(np.searchsorted(self.tpl_start, chosen, side="right") - 1, minlength=len(self.sizes))
        ptr = np.zeros(len(count) + 1, dtype=np.int64)
        np.cumsum(count, out=ptr[1:])
        tpl = self.inst_tpl if instances is None else self.inst_tpl[instances]
        base = self.inst_base[:-1] if instances is None else self.inst_base[instances]
        per_inst = count[tpl]
        first = np.cumsum(per_inst) - per_inst  # each instance's first place in the output
        at = np.repeat(ptr[:-1][tpl] - first, per_inst)
        at += np.arange(len(at), dtype=np.int64)
        rows = chosen[at]
        del at
        tasks = rows + np.repeat(base - self.tpl_start[tpl], per_inst)
        return tasks, rows

    def rows_of(self, tasks: np.ndarray) -> np.ndarray:
        """The template row of each of ``tasks`` (int64)."""
        inst = self.inst_of[tasks]
        return self.tpl_start[self.inst_tpl[inst]] + (np.asarray(tasks, dtype=np.int64) - self.inst_base[inst])

    def row_sums(self, bins: np.ndarray, values: np.ndarray, n_bins: int) -> np.ndarray:
        """Per bin ``0 .. n_bins - 1``, the ``values`` (one per template row) of every task whose
        row has that bin (``bins``: one per row, -1: none), added task after task: the floats of
        ``np.add.at`` or ``np.bincount`` over the tasks, without per-task arrays (a compiled loop
        over the instances; without numba, ``np.bincount`` over runs of instances, each run's
        sums started from the previous run's)."""
        bins = np.ascontiguousarray(bins, dtype=np.int64)
        values = np.ascontiguousarray(values, dtype=np.float64)
        out = np.zeros(n_bins)
        kernel = _row_sums_kernel()
        if kernel is not None:
            kernel(out, self.inst_tpl, self.tpl_start, bins, values)
            return out
        keep = bins >= 0
        head = np.arange(n_bins, dtype=np.int64)
        for _, _, rows in self._row_runs():
            rows = rows[keep[rows]]
            out = np.bincount(np.concatenate([head, bins[rows]]), weights=np.concatenate([out, values[rows]]),
                              minlength=n_bins)
        return out

    def instance_max(self, values: np.ndarray) -> np.ndarray:
        """Per instance, the largest of ``values`` (one per task) over its tasks (-inf: none)."""
        out = np.full(self.n_instances, -np.inf)
        has = np.flatnonzero(np.diff(self.inst_base) > 0)
        if len(has):
            out[has] = np.maximum.reduceat(values, self.inst_base[has])
        return out

    def _row_runs(self, chunk: int = 1 << 20):
        """The row of every task, in runs of whole instances of about ``chunk`` tasks: ``(first
        instance, instance after the last, rows)``."""
        sizes = self.sizes[self.inst_tpl]
        n_inst = self.n_instances
        i0 = 0
        while i0 < n_inst:
            i1 = int(np.searchsorted(self.inst_base, self.inst_base[i0] + chunk, side="right"))
            i1 = min(max(i1 - 1, i0 + 1), n_inst)
            rows = np.repeat(self.tpl_start[self.inst_tpl[i0:i1]] - self.inst_base[i0:i1], sizes[i0:i1])
            rows += np.arange(int(self.inst_base[i0]), int(self.inst_base[i1]), dtype=np.int64)
            yield i0, i1, rows
            i0 = i1

    def _rows_of_tasks(self) -> np.ndarray:
        sizes = self.sizes[self.inst_tpl]
        rows = np.repeat(self.tpl_start[self.inst_tpl] - self.inst_base[:-1], sizes)
        rows += np.arange(self.n_tasks, dtype=np.int64)
        return rows

    def column(self, name: str) -> np.ndarray:
        """The TaskGraph column ``name`` (``micro_batch`` and ``priority`` included), per task."""
        if name == "priority":
            return np.arange(self.n_tasks, dtype=np.int64)
        if name == "micro_batch":
            return np.repeat(self.inst_mb, self.sizes[self.inst_tpl]).astype(np.int32)
        col = self.rows[name][self._rows_of_tasks()]
        if name == "collective":
            has = col >= 0
            col[has] += np.repeat(self.inst_coll[:-1].astype(np.int32), self.sizes[self.inst_tpl])[has]
        return col

    def column_chunks(self, names: tuple[str, ...], chunk: int = 1 << 20):
        """The columns ``names`` (``micro_batch`` included) of consecutive runs of whole
        instances of about ``chunk`` tasks, in task order: an aggregation over tasks without
        building whole columns."""
        sizes = self.sizes[self.inst_tpl]
        for i0, i1, rows in self._row_runs(chunk):
            yield {name: np.repeat(self.inst_mb[i0:i1], sizes[i0:i1]) if name == "micro_batch" else self.rows[name][rows]
                   for name in names}

    def collectives(self) -> tuple[Collective, ...]:
        """Every instance's collectives in order (the TaskGraph's ``collectives``)."""
        out: list[Collective] = []
        for j in self.inst_tpl.tolist():
            out.extend(self.tpl_colls[j])
        return tuple(out)

    def _reference_edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(dst, src)`` of every reference whose target exists, template after template: each
        task's references in their order (group after group)."""
        n_x = np.diff(self.xref_ptr)
        dst_parts, src_parts = [], []
        tpl_of = self.inst_tpl
        for j in np.unique(tpl_of).tolist():
            a, b = self.tpl_start[j], self.tpl_start[j + 1]
            lo, hi = self.xref_ptr[a], self.xref_ptr[b]
            if hi == lo:
                continue
            rels = np.repeat(np.arange(b - a, dtype=np.int64), n_x[a:b])
            groups = self.xref_group[lo:hi].astype(np.int64)
            r_rels = self.xref_rel[lo:hi].astype(np.int64)
            lastkernel = self.grp_lastkernel[self.grp_start[j] + groups]
            insts = np.flatnonzero(tpl_of == j)
            tgt = self.target[self.inst_gstart[insts][:, None] + groups[None, :]].astype(np.int64)
            ok = tgt >= 0
            tgt0 = np.maximum(tgt, 0)
            src_rel = np.where(lastkernel[None, :], self.last_compute[self.inst_tpl[tgt0]], r_rels[None, :])
            dst_parts.append((self.inst_base[insts][:, None] + rels[None, :])[ok])
            src_parts.append((self.inst_base[tgt0] + src_rel)[ok])
        if not dst_parts:
            return np.zeros(0, dtype=np.int32), np.zeros(0, dtype=np.int32)
        return np.concatenate(dst_parts).astype(np.int32), np.concatenate(src_parts).astype(np.int32)

    def _chain_edges(self) -> tuple[np.ndarray, np.ndarray]:
        has = np.flatnonzero(self.chain_prev >= 0)
        prev = self.chain_prev[has]
        dst = self.inst_base[has] + self.first_compute[self.inst_tpl[has]]
        src = self.inst_base[prev] + self.last_compute[self.inst_tpl[prev]]
        return dst.astype(np.int32), src.astype(np.int32)

    def edges(self) -> tuple[np.ndarray, np.ndarray]:
        """``(pred_ptr, pred_idx)`` of the TaskGraph: per task its unit's predecessors, then its
        references, then the kernel it follows on its GPU."""
        n = self.n_tasks
        n_int = np.diff(self.ipred_ptr)
        e_size = self.ipred_ptr[self.tpl_start[1:]] - self.ipred_ptr[self.tpl_start[:-1]]
        rel_dst = np.repeat(np.arange(len(n_int), dtype=np.int64), n_int) - np.repeat(self.tpl_start[:-1], e_size)
        e_out = np.zeros(self.n_instances + 1, dtype=np.int64)
        np.cumsum(e_size[self.inst_tpl], out=e_out[1:])
        erows = np.repeat(self.ipred_ptr[self.tpl_start[:-1]][self.inst_tpl] - e_out[:-1], e_size[self.inst_tpl])
        erows += np.arange(int(e_out[-1]), dtype=np.int64)
        offset = np.repeat(self.inst_base[:-1], e_size[self.inst_tpl])
        dst_int = (rel_dst[erows] + offset).astype(np.int32)
        src_int = (self.ipred[erows].astype(np.int64) + offset).astype(np.int32)
        del erows, offset
        dst_x, src_x = self._reference_edges()
        dst_c, src_c = self._chain_edges()
        dst = np.concatenate([dst_int, dst_x, dst_c])
        src = np.concatenate([src_int, src_x, src_c])
        del dst_int, src_int, dst_x, src_x
        order = np.argsort(dst, kind="stable")
        pred_idx = src[order]
        del order, src
        pred_ptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(dst, minlength=n), out=pred_ptr[1:])
        return pred_ptr, pred_idx

    # ------------------------------------------------------------------ for evaluators
    def counts(self) -> tuple[np.ndarray, np.ndarray]:
        """Per task, its predecessors and its successors (int32): what an evaluator starts from."""
        dst_x, src_x = self._reference_edges()
        dst_c, src_c = self._chain_edges()
        n = self.n_tasks
        preds = self.take_rows(np.diff(self.ipred_ptr).astype(np.int32))
        preds += np.bincount(dst_x, minlength=n).astype(np.int32)
        np.add.at(preds, dst_c, 1)
        succs = self.take_rows(np.diff(self.successors().isucc_ptr).astype(np.int32))
        succs += np.bincount(src_x, minlength=n).astype(np.int32)
        np.add.at(succs, src_c, 1)
        return preds, succs

    def pred_counts(self) -> np.ndarray:
        """Per task, its predecessors (int32): :meth:`counts`' first array alone."""
        dst_x, _ = self._reference_edges()
        dst_c, _ = self._chain_edges()
        preds = self.take_rows(np.diff(self.ipred_ptr).astype(np.int32))
        preds += np.bincount(dst_x, minlength=self.n_tasks).astype(np.int32)
        np.add.at(preds, dst_c, 1)
        return preds

    def max_successors(self) -> int:
        """A bound on any task's successors: the most its row has in the unit, plus the most the
        references into one instance can add to one of its tasks (per group, the most rows
        reading one target row, or every row of a ``lastkernel`` group), plus the next kernel."""
        su = self.successors()
        in_unit = int(np.diff(su.isucc_ptr).max(initial=0))
        n_groups = len(self.grp_lastkernel)
        fan = np.zeros(n_groups, dtype=np.int64)
        readers = np.diff(su.rev_ptr)
        for g in range(n_groups):
            if self.grp_lastkernel[g]:
                fan[g] = su.grp_rel_ptr[g + 1] - su.grp_rel_ptr[g]
            elif su.rev_base[g + 1] > su.rev_base[g] + 1:
                fan[g] = readers[su.rev_base[g]:su.rev_base[g + 1] - 1].max()
        refs = np.repeat(np.arange(self.n_instances), np.diff(su.inc_ptr))
        into = np.bincount(refs, weights=fan[su.inc_group], minlength=self.n_instances) if len(refs) else np.zeros(1)
        return in_unit + int(into.max(initial=0)) + 1

    def successors(self) -> Successors:
        """The successor indexes (built once)."""
        hit = self._cache.get("successors")
        if hit is None:
            hit = self._cache["successors"] = self._successors()
        return hit

    def _successors(self) -> Successors:
        rows = len(self.ipred_ptr) - 1
        # successors in the unit: the predecessor lists reversed, each ascending
        n_int = np.diff(self.ipred_ptr)
        row_of_edge = np.repeat(np.arange(rows, dtype=np.int64), n_int)
        tpl_of_row = np.repeat(np.arange(len(self.sizes), dtype=np.int64), self.sizes)
        src_row = self.tpl_start[tpl_of_row[row_of_edge]] + self.ipred.astype(np.int64) if len(row_of_edge) else \
            np.zeros(0, dtype=np.int64)
        dst_rel = row_of_edge - self.tpl_start[tpl_of_row[row_of_edge]] if len(row_of_edge) else row_of_edge
        order = np.argsort(src_row, kind="stable")  # by source row, then target (edges ascend by target)
        isucc = dst_rel[order].astype(np.int32)
        isucc_ptr = np.zeros(rows + 1, dtype=np.int64)
        np.cumsum(np.bincount(src_row, minlength=rows), out=isucc_ptr[1:])
        # references pointing at each instance
        n_groups = len(self.grp_lastkernel)
        n_g = np.diff(self.inst_gstart)
        g_of = np.repeat(self.grp_start[:-1][self.inst_tpl] - self.inst_gstart[:-1], n_g)
        g_of += np.arange(len(self.target), dtype=np.int64)
        i_of = np.repeat(np.arange(self.n_instances, dtype=np.int64), n_g)
        valid = self.target >= 0
        tgt = self.target[valid].astype(np.int64)
        order = np.argsort(tgt, kind="stable")
        inc_inst = i_of[valid][order].astype(np.int32)
        inc_group = g_of[valid][order].astype(np.int32)
        inc_ptr = np.zeros(self.n_instances + 1, dtype=np.int64)
        np.cumsum(np.bincount(tgt, minlength=self.n_instances), out=inc_ptr[1:])
        # per group: the rows reading each target row, and all the rows of its references
        rev_base = np.zeros(n_groups + 1, dtype=np.int64)
        rev_ptr_parts, rev_rel_parts, grp_rel_parts = [], [], []
        grp_rel_ptr = np.zeros(n_groups + 1, dtype=np.int64)
        at = 0
        for j in range(len(self.sizes)):
            a, b = self.tpl_start[j], self.tpl_start[j + 1]
            lo, hi = self.xref_ptr[a], self.xref_ptr[b]
            rels = np.repeat(np.arange(b - a, dtype=np.int64), np.diff(self.xref_ptr[a:b + 1]))
            groups = self.xref_group[lo:hi].astype(np.int64)
            r_rels = self.xref_rel[lo:hi].astype(np.int64)
            for g in range(int(self.grp_start[j + 1] - self.grp_start[j])):
                gg = int(self.grp_start[j]) + g
                mine = groups == g
                my_rels = rels[mine]  # ascending (rows in order, a row's references together)
                first = np.ones(len(my_rels), dtype=np.bool_)
                np.not_equal(my_rels[1:], my_rels[:-1], out=first[1:])
                grp_rel_parts.append(my_rels[first].astype(np.int32))  # the distinct rows, ascending
                grp_rel_ptr[gg + 1] = len(grp_rel_parts[-1])
                tt = int(self.grp_target_tpl[gg])
                size = int(self.sizes[tt]) if tt >= 0 else 0
                counts = np.bincount(r_rels[mine], minlength=size) if tt >= 0 else np.zeros(0, dtype=np.int64)
                ptr = np.zeros(size + 1, dtype=np.int64)
                np.cumsum(counts, out=ptr[1:])
                rev_ptr_parts.append(ptr + at)
                # by target row, then reading row: a stable sort by target row (my_rels ascend)
                ordr = np.argsort(r_rels[mine], kind="stable") if tt >= 0 else np.zeros(0, dtype=np.int64)
                rev_rel_parts.append(my_rels[ordr].astype(np.int32))
                at += int(counts.sum())
                rev_base[gg + 1] = size + 1
        np.cumsum(rev_base, out=rev_base)
        np.cumsum(grp_rel_ptr, out=grp_rel_ptr)
        # the instance each instance's last kernel precedes
        chain_next = np.full(self.n_instances, -1, dtype=np.int32)
        has = np.flatnonzero(self.chain_prev >= 0)
        chain_next[self.chain_prev[has]] = has
        cat = np.concatenate
        return Successors(isucc_ptr=isucc_ptr, isucc=isucc, inc_ptr=inc_ptr, inc_inst=inc_inst, inc_group=inc_group,
                          rev_base=rev_base, rev_ptr=cat(rev_ptr_parts) if rev_ptr_parts else np.zeros(1, np.int64),
                          rev_rel=cat(rev_rel_parts) if rev_rel_parts else np.zeros(0, np.int32),
                          grp_rel_ptr=grp_rel_ptr, grp_rel=cat(grp_rel_parts) if grp_rel_parts else np.zeros(0, np.int32),
                          chain_next=chain_next)


def _add_rows(out, inst_tpl, tpl_start, bins, values):
    """:meth:`TaskProgram.row_sums`' loop: every instance's rows in order, each row's value into
    its bin."""
    for i in range(len(inst_tpl)):
        j = inst_tpl[i]
        for r in range(tpl_start[j], tpl_start[j + 1]):
            b = bins[r]
            if b >= 0:
                out[b] += values[r]


_KERNELS: dict = {}


def _row_sums_kernel():
    """:func:`_add_rows` compiled (numba, kept in its cache), or None without numba or with
    ``MARSSIM_NO_NUMBA`` set."""
    if "row_sums" not in _KERNELS:
        kernel = None
        if os.environ.get("MARSSIM_NO_NUMBA", "") in ("", "0"):
            try:
                from numba import njit
            except ImportError:
                pass
            else:
                kernel = njit(cache=True)(_add_rows)
        _KERNELS["row_sums"] = kernel
    return _KERNELS["row_sums"]
