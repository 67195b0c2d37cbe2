"""The unit templates of a run and their instances, in task order, as a
:class:`~marssim.taskprogram.TaskProgram`: each template's rows once, each instance (a unit of a
representative GPU for one micro-batch) as its template, first task and the instances its
references read (:func:`task_program`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from marssim.taskprogram import CoupledSteps, TaskProgram

from .template import COLUMNS, LAST, LAST_BACKWARD, Template, template_edges

__all__ = ["Instances", "Order", "instances", "task_program"]

Order = list[tuple[int, tuple[int, str], int]]
"""The units of a run in task order: (representative GPU, unit key (chunk, direction), micro-batch)."""


@dataclass
class Instances:
    """The unit instances of a lowering in task order: which template each copies, its
    micro-batch, its first task and its first collective; the templates in first-use order."""

    templates: list[Template]
    keys: list[tuple[int, tuple[int, str]]]  # (rep, unit key) of each template
    tpl: np.ndarray  # per instance, its template's index
    rep: np.ndarray  # per instance, its representative GPU
    mb: np.ndarray  # per instance, its micro-batch
    base: np.ndarray  # per instance, its first task (int64; one more entry: the task count)
    coll: np.ndarray  # per instance, its first collective (one more entry: the count)
    index: dict[tuple[int, tuple[int, str], int], int]  # (rep, key, mb) -> instance

    @property
    def n_tasks(self) -> int:
        return int(self.base[-1])


def instances(built: Mapping[tuple[int, tuple[int, str]], Template], order: Order) -> Instances:
    """The instances of ``order`` with the templates ``built`` by (representative, unit key)."""
    tpl_of: dict[tuple[int, tuple[int, str]], int] = {}
    templates: list[Template] = []
    keys: list[tuple[int, tuple[int, str]]] = []
    tpl = np.empty(len(order), dtype=np.int64)
    reps = np.empty(len(order), dtype=np.int64)
    mbs = np.empty(len(order), dtype=np.int64)
    index: dict[tuple[int, tuple[int, str], int], int] = {}
    for i, (rep, key, mb) in enumerate(order):
        j = tpl_of.get((rep, key))
        if j is None:
            j = tpl_of[(rep, key)] = len(templates)
            templates.append(built[(rep, key)])
            keys.append((rep, key))
        tpl[i] = j
        reps[i] = rep
        mbs[i] = mb
        index[(rep, key, mb)] = i
    sizes = np.asarray([len(t) for t in templates], dtype=np.int64)[tpl]
    colls = np.asarray([len(t.colls) for t in templates], dtype=np.int64)[tpl]
    base = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(sizes, out=base[1:])
    coll = np.zeros(len(order) + 1, dtype=np.int64)
    np.cumsum(colls, out=coll[1:])
    return Instances(templates, keys, tpl, reps, mbs, base, coll, index)


def task_program(built: Mapping[tuple[int, tuple[int, str]], Template], order: Order) -> TaskProgram:
    """The unit templates (``built``) and their instances in ``order`` as a :class:`TaskProgram`: each
    template's rows, predecessors in the unit and references grouped by the unit they read; each
    instance's template, micro-batch, first task and collective, the target instance of each
    group and the instance whose last kernel its first kernel follows."""
    inst = instances(built, order)
    templates = inst.templates
    for tpl in templates:
        if not hasattr(tpl, "ext_groups"):
            template_edges(tpl)
    sizes = np.asarray([len(t) for t in templates], dtype=np.int64)
    tpl_start = np.zeros(len(templates) + 1, dtype=np.int64)
    np.cumsum(sizes, out=tpl_start[1:])
    # each template's arrays are dropped once copied (a lowering whose units run once holds its
    # tasks twice otherwise)
    rows = {}
    for name, dtype in COLUMNS.items():
        rows[name] = np.concatenate([t.arrays[name] for t in templates]) if templates else np.zeros(0, dtype=dtype)
        for t in templates:
            del t.arrays[name]
    n_ipred = np.concatenate([t.pred_counts for t in templates]) \
        if templates else np.zeros(0, dtype=np.int64)
    ipred_ptr = np.zeros(len(n_ipred) + 1, dtype=np.int64)
    np.cumsum(n_ipred, out=ipred_ptr[1:])
    ipred = np.concatenate([t.edge_src for t in templates]) if templates else np.zeros(0, np.int32)
    for t in templates:
        t.pred_counts = t.edge_src = None
    # references: per row, (group, row read) in group order; the groups of each template
    tpl_index = {key: j for j, key in enumerate(inst.keys)}
    x_rows, x_group, x_rel = [], [], []
    grp_start = np.zeros(len(templates) + 1, dtype=np.int64)
    grp_keys: list[tuple] = []
    for j, tpl in enumerate(templates):
        for g, (key, rels, r_rels) in enumerate(tpl.ext_groups):
            x_rows.append(rels + np.int32(tpl_start[j]))
            x_group.append(np.full(len(rels), g, dtype=np.int32))
            x_rel.append(r_rels)
            grp_keys.append(key)
        grp_start[j + 1] = grp_start[j] + len(tpl.ext_groups)
        tpl.ext_groups = [(key, None, None) for key, _, _ in tpl.ext_groups]  # copied; its keys kept
    if x_rows:
        xr, xg, xl = (np.concatenate(a) for a in (x_rows, x_group, x_rel))
        del x_rows, x_group, x_rel
        # by row, then group, then order within the group: a stable sort by (row, group), as each
        # (row, group) belongs to one group's references, listed in their order
        width = int(np.diff(grp_start).max()) + 1
        order_x = np.argsort(xr.astype(np.int64) * width + xg, kind="stable")
        xr, xg, xl = xr[order_x], xg[order_x], xl[order_x]
        del order_x
    else:
        xr = xg = xl = np.zeros(0, dtype=np.int64)
    xref_ptr = np.zeros(len(n_ipred) + 1, dtype=np.int64)
    np.cumsum(np.bincount(xr, minlength=len(n_ipred)), out=xref_ptr[1:])
    lastkernel = np.asarray([key[1] == LAST_BACKWARD for key in grp_keys], dtype=np.bool_)
    target_tpl = np.asarray([-1 if last else tpl_index.get((key[0], key[1]), -1)
                             for key, last in zip(grp_keys, lastkernel)], dtype=np.int32)
    targets = _group_targets(inst, templates, grp_start, grp_keys, lastkernel, tpl_index)
    first = np.asarray([t.first_compute for t in templates], dtype=np.int32)
    last = np.asarray([t.last_compute for t in templates], dtype=np.int32)
    chain_prev = np.full(len(inst.tpl), -1, dtype=np.int32)
    with_compute = np.flatnonzero(first[inst.tpl] >= 0)
    same_rep = inst.rep[with_compute[1:]] == inst.rep[with_compute[:-1]]
    chain_prev[with_compute[1:][same_rep]] = with_compute[:-1][same_rep]
    n_groups = grp_start[1:] - grp_start[:-1]
    inst_gstart = np.zeros(len(inst.tpl) + 1, dtype=np.int64)
    np.cumsum(n_groups[inst.tpl], out=inst_gstart[1:])
    return TaskProgram(
        rows=rows, tpl_start=tpl_start, ipred_ptr=ipred_ptr, ipred=ipred, xref_ptr=xref_ptr,
        xref_group=xg.astype(np.int32, copy=False), xref_rel=xl.astype(np.int32, copy=False), grp_start=grp_start,
        grp_lastkernel=lastkernel,
        grp_target_tpl=target_tpl, first_compute=first, last_compute=last,
        tpl_colls=tuple(tuple(t.colls) for t in templates), inst_tpl=inst.tpl.astype(np.int32),
        inst_mb=inst.mb.astype(np.int32), inst_base=inst.base, inst_coll=inst.coll, inst_gstart=inst_gstart,
        target=targets, chain_prev=chain_prev, coupled=_coupled(inst, templates, tpl_index))


def _group_targets(inst: Instances, templates: list[Template], grp_start: np.ndarray, grp_keys: list[tuple],
                   lastkernel: np.ndarray, tpl_index: dict) -> np.ndarray:
    """Per (instance, group of its template): the instance the group's references read (the same
    micro-batch, or the last one for ``last`` references; a ``lastkernel`` group: the last
    instance with a backward pass before it on its GPU), -1 when there is none."""
    n_inst = len(inst.tpl)
    n_groups = grp_start[1:] - grp_start[:-1]
    inst_gstart = np.zeros(n_inst + 1, dtype=np.int64)
    np.cumsum(n_groups[inst.tpl], out=inst_gstart[1:])
    out = np.full(int(inst_gstart[-1]), -1, dtype=np.int32)
    by_key, last_mb = _instances_by_key(inst, tpl_index)
    needs_backward = bool(lastkernel.any())
    last_backward = np.full(n_inst, -1, dtype=np.int64)
    if needs_backward:  # the latest instance before each one, on its GPU, with a backward kernel
        latest: dict[int, int] = {}
        for i, (j, rep) in enumerate(zip(inst.tpl.tolist(), inst.rep.tolist())):
            last_backward[i] = latest.get(rep, -1)
            if templates[j].first_compute >= 0 and inst.keys[j][1][1] == "B":
                latest[rep] = i
    for j in range(len(templates)):
        mine = np.flatnonzero(inst.tpl == j)
        if not len(mine):
            continue
        for g in range(int(n_groups[j])):
            gg = int(grp_start[j]) + g
            slots = inst_gstart[mine] + g
            if lastkernel[gg]:
                out[slots] = last_backward[mine]
                continue
            r_rep, r_key, mode = grp_keys[gg]
            table = by_key.get((r_rep, r_key))
            if table is None:
                continue
            r_mb = np.full(len(mine), last_mb[(r_rep, r_key)]) if mode == LAST else inst.mb[mine]
            inside = r_mb < len(table)
            out[slots[inside]] = table[r_mb[inside]]
    return out


def _instances_by_key(inst: Instances, tpl_index: dict) -> tuple[dict[tuple, np.ndarray], dict[tuple, int]]:
    """Per (rep, unit key): its instances by micro-batch (-1: none), and its last micro-batch."""
    by_key: dict[tuple, np.ndarray] = {}
    last_mb: dict[tuple, int] = {}
    for (rep, key), j in tpl_index.items():
        mine = np.flatnonzero(inst.tpl == j)
        mbs = inst.mb[mine]
        table = np.full(int(mbs.max()) + 1 if len(mbs) else 1, -1, dtype=np.int64)
        table[mbs] = mine
        by_key[(rep, key)] = table
        last_mb[(rep, key)] = int(mbs.max()) if len(mbs) else 0
    return by_key, last_mb


def _coupled(inst: Instances, templates: list[Template], tpl_index: dict) -> CoupledSteps | None:
    """The coupled ring transfers of the instances (:class:`~marssim.taskprogram.CoupledSteps`):
    each one's task, the task of the same micro-batch of the representative feeding its steps,
    and its bytes per step; None when the lowering made none."""
    if not any(t.coupled for t in templates):
        return None
    by_key, _ = _instances_by_key(inst, tpl_index)
    tasks, prevs, chunks = [], [], []
    for j, tpl in enumerate(templates):
        if not tpl.coupled:
            continue
        mine = np.flatnonzero(inst.tpl == j)
        key = inst.keys[j][1]
        for rel, prv_rep, chunk in tpl.coupled:
            table = by_key[(prv_rep, key)]
            feeder = table[inst.mb[mine]]
            if (feeder < 0).any():
                raise AssertionError(f"a coupled ring transfer of unit {key} has no feeder on GPU {prv_rep}")
            tasks.append(inst.base[mine] + rel)
            prevs.append(inst.base[feeder] + rel)
            chunks.append(np.full(len(mine), chunk))
    task = np.concatenate(tasks)
    order = np.argsort(task, kind="stable")
    return CoupledSteps(task=task[order], prev=np.concatenate(prevs)[order], chunk=np.concatenate(chunks)[order])
