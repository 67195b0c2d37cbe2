"""The estimate's two schedules over a :class:`~marssim.taskprogram.TaskProgram` (numba).

The same list schedule and earliest schedule as :mod:`._numba_kernels`, and the same floats:
each task's duration and device are its template row's, its successors are walked from the
program (its row's successors in the unit, the references pointing at its instance, the kernel
after it on its GPU) instead of a per-task list. A task's start and end do not depend on the
order in which its successors are visited (a transfer ends at its ready time plus its duration; a
compute task waits in a heap ordered by time, priority and task), so both give the same arrays.
The transfers of a ring of coupled steps (:class:`~marssim.taskprogram.CoupledSteps`) wait until
all of them are ready; then their steps are timed one by one (:func:`_coupled_ends`) and they
end together, with the floats those steps give when held as one task each.
Importing this module raises ImportError when numba is missing.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from ._numba_kernels import _ev_pop, _ev_push, _q_pop, _q_push
from .events import EV_DEVICE, EV_READY

__all__ = ["list_schedule", "earliest_schedule", "chained_schedule", "compute_chains"]


@njit(cache=True, inline="always")
def _row(t, inst_of, i_tpl, i_base, t_start):
    i = inst_of[t]
    return i, t_start[i_tpl[i]] + t - i_base[i]


@njit(cache=True, inline="always")
def _successors(t, out, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst,
                inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next):
    """Write task ``t``'s successors into ``out``; return how many."""
    i, row = _row(t, inst_of, i_tpl, i_base, t_start)
    base = i_base[i]
    k = 0
    for e in range(isucc_ptr[row], isucc_ptr[row + 1]):
        out[k] = base + isucc[e]
        k += 1
    tpl = i_tpl[i]
    rel = row - t_start[tpl]
    for q in range(inc_ptr[i], inc_ptr[i + 1]):
        b2 = i_base[inc_inst[q]]
        gg = inc_group[q]
        if g_lastkernel[gg]:
            if rel == t_last[tpl]:
                for e in range(g_rel_ptr[gg], g_rel_ptr[gg + 1]):
                    out[k] = b2 + g_rel[e]
                    k += 1
        else:
            a = g_rev_base[gg] + rel
            for e in range(rev_ptr[a], rev_ptr[a + 1]):
                out[k] = b2 + rev_rel[e]
                k += 1
    nxt = i_next[i]
    if nxt >= 0 and rel == t_last[tpl]:
        out[k] = i_base[nxt] + t_first[i_tpl[nxt]]
        k += 1
    return k


@njit(cache=True, inline="always")
def _release(t, e, at, waiting, stack, top, succ, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc,
             inc_ptr, inc_inst, inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next):
    """Task ``t`` ended at ``e``: raise its successors' ``at`` (ready time) to ``e`` and push
    those with no predecessor left onto ``stack``; return the new top."""
    ns = _successors(t, succ, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst,
                     inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
    for j in range(ns):
        u = succ[j]
        if e > at[u]:
            at[u] = e
        waiting[u] -= 1
        if waiting[u] == 0:
            stack[top] = u
            top += 1
    return top


@njit(cache=True)
def _coupled_ends(comp, at, end, c_task, c_ptr, c_members, c_prev_local, c_d, c_k):
    """The ends of a ring of coupled transfers (:class:`~marssim.taskprogram.CoupledSteps`)
    whose tasks are all ready (``at``): step 0 of each starts when it is ready, step k once its
    own step k - 1 and its feeder's have ended, each step taking its ``c_d`` seconds; the same
    floats as those steps held as one task each."""
    a = c_ptr[comp]
    size = c_ptr[comp + 1] - a
    cur = np.empty(size)
    nxt = np.empty(size)
    for i in range(size):
        m = c_members[a + i]
        cur[i] = at[c_task[m]] + c_d[m]
    for _ in range(1, c_k[c_members[a]]):
        for i in range(size):
            m = c_members[a + i]
            own = cur[i]
            fed = cur[c_prev_local[m]]
            nxt[i] = (own if own > fed else fed) + c_d[m]
        cur, nxt = nxt, cur
    for i in range(size):
        end[c_task[c_members[a + i]]] = cur[i]


@njit(cache=True)
def _coupled_ready(t, at, start, end, waiting, stack, top, succ, c_task, c_comp, c_ptr, c_members, c_prev_local, c_d,
                   c_k, c_wait, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst,
                   inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next):
    """Coupled transfer ``t`` is ready (at ``at[t]``). Once every transfer of its ring is, time
    their steps (:func:`_coupled_ends`), start each at its ready time and release their
    successors. Returns the new stack top and how many tasks ended."""
    comp = c_comp[np.searchsorted(c_task, t)]
    c_wait[comp] -= 1
    if c_wait[comp] > 0:
        return top, 0
    _coupled_ends(comp, at, end, c_task, c_ptr, c_members, c_prev_local, c_d, c_k)
    for q in range(c_ptr[comp], c_ptr[comp + 1]):
        tm = c_task[c_members[q]]
        start[tm] = at[tm]
        top = _release(tm, end[tm], at, waiting, stack, top, succ, inst_of, i_tpl, i_base, t_start, t_first, t_last,
                       isucc_ptr, isucc, inc_ptr, inc_inst, inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr,
                       rev_rel, g_rel, i_next)
    return top, c_ptr[comp + 1] - c_ptr[comp]


@njit(cache=True)
def list_schedule(d_row, dev_row, n_pred, n_devices, per_dev, max_succ, row_coupled, c_task, c_comp, c_ptr, c_members,
                  c_prev_local, c_d, c_k, c_wait, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc,
                  inc_ptr, inc_inst, inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next):
    """``(start, ready, end, done)``: the list schedule of :mod:`._numba_kernels` (priority = task)."""
    n = n_pred.shape[0]
    waiting = n_pred.copy()
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)
    free_at = np.zeros(n_devices)
    pending = np.zeros(n_devices, dtype=np.bool_)
    qbase = np.zeros(n_devices + 1, dtype=np.int64)
    for v in range(n_devices):
        qbase[v + 1] = qbase[v] + per_dev[v]
    qsize = np.zeros(n_devices, dtype=np.int64)
    qp = np.zeros(max(qbase[n_devices], 1), dtype=np.int32)
    qt = np.zeros(max(qbase[n_devices], 1), dtype=np.int32)
    cap = n + n_devices + 1
    et = np.zeros(cap)
    ek = np.zeros(cap, dtype=np.int8)
    ep = np.zeros(cap, dtype=np.int32)
    ex = np.zeros(cap, dtype=np.int32)
    ne = 0
    stack = np.zeros(n + 1, dtype=np.int32)
    succ = np.zeros(max_succ + 1, dtype=np.int64)
    top = 0
    for t in range(n - 1, -1, -1):
        if waiting[t] == 0:
            stack[top] = t
            top += 1
    done = 0
    while True:
        while top > 0:
            top -= 1
            t = stack[top]
            _, row = _row(t, inst_of, i_tpl, i_base, t_start)
            if row_coupled[row]:
                top, ended = _coupled_ready(t, ready, start, end, waiting, stack, top, succ, c_task, c_comp, c_ptr,
                                            c_members, c_prev_local, c_d, c_k, c_wait, inst_of, i_tpl, i_base,
                                            t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst, inc_group,
                                            g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
                done += ended
            elif dev_row[row] < 0:
                s = ready[t]
                e = s + d_row[row]
                start[t] = s
                end[t] = e
                done += 1
                ns = _successors(t, succ, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr,
                                 inc_inst, inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
                for j in range(ns):
                    u = succ[j]
                    if e > ready[u]:
                        ready[u] = e
                    waiting[u] -= 1
                    if waiting[u] == 0:
                        stack[top] = u
                        top += 1
            else:
                ne = _ev_push(et, ek, ep, ex, ne, ready[t], EV_READY, t, t)
        if ne == 0:
            break
        ne = _ev_pop(et, ek, ep, ex, ne)
        now = et[ne]
        kind = ek[ne]
        p = ep[ne]
        x = ex[ne]
        if kind == EV_READY:
            _, row = _row(x, inst_of, i_tpl, i_base, t_start)
            v = dev_row[row]
            if free_at[v] <= now and qsize[v] == 0:
                t = x
            else:
                qsize[v] = _q_push(qp, qt, qbase[v], qsize[v], p, x)
                if not pending[v]:
                    pending[v] = True
                    ne = _ev_push(et, ek, ep, ex, ne, free_at[v] if free_at[v] > now else now, EV_DEVICE, 0, v)
                continue
        else:
            v = x
            t = _q_pop(qp, qt, qbase[v], qsize[v])
            qsize[v] -= 1
            pending[v] = qsize[v] > 0
        _, row = _row(t, inst_of, i_tpl, i_base, t_start)
        e = now + d_row[row]
        start[t] = now
        end[t] = e
        free_at[v] = e
        done += 1
        if pending[v]:
            ne = _ev_push(et, ek, ep, ex, ne, e, EV_DEVICE, 0, v)
        ns = _successors(t, succ, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr,
                         inc_inst, inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
        for j in range(ns):
            u = succ[j]
            if e > ready[u]:
                ready[u] = e
            waiting[u] -= 1
            if waiting[u] == 0:
                stack[top] = u
                top += 1
    return start, ready, end, done


@njit(cache=True)
def earliest_schedule(d_row, n_pred, max_succ, row_coupled, c_task, c_comp, c_ptr, c_members, c_prev_local, c_d, c_k,
                      c_wait, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst,
                      inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next):
    """``(end, done)``: every task starting when its predecessors end (:func:`chained_schedule`'s
    ends)."""
    _, end, done = chained_schedule(d_row, n_pred, max_succ, row_coupled, c_task, c_comp, c_ptr, c_members,
                                    c_prev_local, c_d, c_k, c_wait, inst_of, i_tpl, i_base, t_start, t_first, t_last,
                                    isucc_ptr, isucc, inc_ptr, inc_inst, inc_group, g_lastkernel, g_rev_base,
                                    g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
    return end, done


@njit(cache=True)
def chained_schedule(d_row, n_pred, max_succ, row_coupled, c_task, c_comp, c_ptr, c_members, c_prev_local, c_d, c_k,
                     c_wait, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst,
                     inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next):
    """``(start, end, done)``: every task starting when its predecessors end, start kept. This is
    the list schedule (and its ``ready`` is ``start``) when each GPU's kernels are totally ordered
    by their dependencies (:func:`compute_chains`): a kernel never finds its GPU busy."""
    n = n_pred.shape[0]
    waiting = n_pred.copy()
    start = np.zeros(n)
    end = np.zeros(n)
    stack = np.zeros(n + 1, dtype=np.int32)
    succ = np.zeros(max_succ + 1, dtype=np.int64)
    top = 0
    for t in range(n - 1, -1, -1):
        if waiting[t] == 0:
            stack[top] = t
            top += 1
    done = 0
    while top > 0:
        top -= 1
        t = stack[top]
        _, row = _row(t, inst_of, i_tpl, i_base, t_start)
        if row_coupled[row]:
            top, ended = _coupled_ready(t, start, start, end, waiting, stack, top, succ, c_task, c_comp, c_ptr,
                                        c_members, c_prev_local, c_d, c_k, c_wait, inst_of, i_tpl, i_base, t_start,
                                        t_first, t_last, isucc_ptr, isucc, inc_ptr, inc_inst, inc_group, g_lastkernel,
                                        g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
            done += ended
            continue
        e = start[t] + d_row[row]
        end[t] = e
        done += 1
        # the loop of _release, written out: numba's inlining of it made this pass ~40% slower
        ns = _successors(t, succ, inst_of, i_tpl, i_base, t_start, t_first, t_last, isucc_ptr, isucc, inc_ptr,
                         inc_inst, inc_group, g_lastkernel, g_rev_base, g_rel_ptr, rev_ptr, rev_rel, g_rel, i_next)
        for j in range(ns):
            u = succ[j]
            if e > start[u]:
                start[u] = e
            waiting[u] -= 1
            if waiting[u] == 0:
                stack[top] = u
                top += 1
    return start, end, done


@njit(cache=True)
def compute_chains(is_compute, device, t_start, ipred_ptr, ipred, t_first, t_last):
    """Whether every template's kernels (its ``is_compute`` rows) run on one ``device`` and each follows
    the one before it through its predecessors in the unit, the first and last being
    ``t_first``/``t_last``; predecessors in the unit must be earlier rows."""
    n_tpl = t_start.shape[0] - 1
    latest = np.full(device.shape[0], -1, dtype=np.int64)  # per row: its latest kernel ancestor (rel)
    for j in range(n_tpl):
        a = t_start[j]
        prev = -1
        dev = -1
        for row in range(a, t_start[j + 1]):
            rel = row - a
            m = -1
            for e in range(ipred_ptr[row], ipred_ptr[row + 1]):
                p = ipred[e]
                if p >= rel or p < 0:
                    return False
                q = p if is_compute[a + p] else latest[a + p]
                if q > m:
                    m = q
            latest[row] = m
            if is_compute[row]:
                if m != prev:
                    return False
                if prev < 0:
                    if t_first[j] != rel:
                        return False
                    dev = device[row]
                elif device[row] != dev:
                    return False
                prev = rel
        if prev != t_last[j]:
            return False
    return True
