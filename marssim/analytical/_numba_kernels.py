"""Compiled versions of the kernels in :mod:`marssim.analytical.schedule` (numba).

Same algorithm, same arithmetic and the same total order on events as the pure-Python versions
(heaps keyed by unique tuples pop in the same order whatever their layout), so both return
identical arrays. Importing this module raises ImportError when numba is missing.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from .events import EV_DEVICE, EV_READY

__all__ = ["list_schedule", "earliest_schedule"]


@njit(cache=True, inline="always")
def _ev_less(et, ek, ep, ex, i, j):
    if et[i] != et[j]:
        return et[i] < et[j]
    if ek[i] != ek[j]:
        return ek[i] < ek[j]
    if ep[i] != ep[j]:
        return ep[i] < ep[j]
    return ex[i] < ex[j]


@njit(cache=True, inline="always")
def _ev_swap(et, ek, ep, ex, i, j):
    et[i], et[j] = et[j], et[i]
    ek[i], ek[j] = ek[j], ek[i]
    ep[i], ep[j] = ep[j], ep[i]
    ex[i], ex[j] = ex[j], ex[i]


@njit(cache=True)
def _ev_push(et, ek, ep, ex, size, time, kind, prio, ident):
    i = size
    et[i] = time
    ek[i] = kind
    ep[i] = prio
    ex[i] = ident
    while i > 0:
        parent = (i - 1) >> 1
        if _ev_less(et, ek, ep, ex, i, parent):
            _ev_swap(et, ek, ep, ex, i, parent)
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _ev_pop(et, ek, ep, ex, size):
    """Move the smallest entry to slot ``size - 1`` and restore the heap on ``[0, size - 1)``."""
    last = size - 1
    _ev_swap(et, ek, ep, ex, 0, last)
    i = 0
    while True:
        left = 2 * i + 1
        if left >= last:
            break
        child = left
        right = left + 1
        if right < last and _ev_less(et, ek, ep, ex, right, left):
            child = right
        if _ev_less(et, ek, ep, ex, child, i):
            _ev_swap(et, ek, ep, ex, child, i)
            i = child
        else:
            break
    return last


@njit(cache=True)
def _q_push(qp, qt, base, size, prio, task):
    i = size
    qp[base + i] = prio
    qt[base + i] = task
    while i > 0:
        parent = (i - 1) >> 1
        a = base + i
        b = base + parent
        if qp[a] < qp[b] or (qp[a] == qp[b] and qt[a] < qt[b]):
            qp[a], qp[b] = qp[b], qp[a]
            qt[a], qt[b] = qt[b], qt[a]
            i = parent
        else:
            break
    return size + 1


@njit(cache=True)
def _q_pop(qp, qt, base, size):
    """Return the task with the smallest ``(priority, task)``; the heap keeps ``size - 1`` entries."""
    top = qt[base]
    last = size - 1
    qp[base] = qp[base + last]
    qt[base] = qt[base + last]
    i = 0
    while True:
        left = 2 * i + 1
        if left >= last:
            break
        child = left
        right = left + 1
        if right < last:
            r = base + right
            lft = base + left
            if qp[r] < qp[lft] or (qp[r] == qp[lft] and qt[r] < qt[lft]):
                child = right
        a = base + child
        b = base + i
        if qp[a] < qp[b] or (qp[a] == qp[b] and qt[a] < qt[b]):
            qp[a], qp[b] = qp[b], qp[a]
            qt[a], qt[b] = qt[b], qt[a]
            i = child
        else:
            break
    return top


@njit(cache=True)
def list_schedule(d, dev, prio, sp, si, n_pred, n_devices):
    n = d.shape[0]
    waiting = n_pred.copy()
    ready = np.zeros(n)
    start = np.zeros(n)
    end = np.zeros(n)
    free_at = np.zeros(n_devices)
    pending = np.zeros(n_devices, dtype=np.bool_)
    # per-device waiting queues, laid out back to back
    qbase = np.zeros(n_devices + 1, dtype=np.int64)
    for t in range(n):
        if dev[t] >= 0:
            qbase[dev[t] + 1] += 1
    for v in range(n_devices):
        qbase[v + 1] += qbase[v]
    qsize = np.zeros(n_devices, dtype=np.int64)
    qp = np.zeros(max(qbase[n_devices], 1), dtype=np.int64)
    qt = np.zeros(max(qbase[n_devices], 1), dtype=np.int64)
    cap = n + n_devices + 1
    et = np.zeros(cap)
    ek = np.zeros(cap, dtype=np.int64)
    ep = np.zeros(cap, dtype=np.int64)
    ex = np.zeros(cap, dtype=np.int64)
    ne = 0
    stack = np.zeros(n + 1, dtype=np.int64)
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
            if dev[t] < 0:
                s = ready[t]
                e = s + d[t]
                start[t] = s
                end[t] = e
                done += 1
                for j in range(sp[t], sp[t + 1]):
                    u = si[j]
                    if e > ready[u]:
                        ready[u] = e
                    waiting[u] -= 1
                    if waiting[u] == 0:
                        stack[top] = u
                        top += 1
            else:
                ne = _ev_push(et, ek, ep, ex, ne, ready[t], EV_READY, prio[t], t)
        if ne == 0:
            break
        ne = _ev_pop(et, ek, ep, ex, ne)
        now = et[ne]
        kind = ek[ne]
        p = ep[ne]
        x = ex[ne]
        if kind == EV_READY:
            v = dev[x]
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
        e = now + d[t]
        start[t] = now
        end[t] = e
        free_at[v] = e
        done += 1
        if pending[v]:
            ne = _ev_push(et, ek, ep, ex, ne, e, EV_DEVICE, 0, v)
        for j in range(sp[t], sp[t + 1]):
            u = si[j]
            if e > ready[u]:
                ready[u] = e
            waiting[u] -= 1
            if waiting[u] == 0:
                stack[top] = u
                top += 1
    return start, ready, end, done


@njit(cache=True)
def earliest_schedule(d, sp, si, n_pred):
    n = d.shape[0]
    waiting = n_pred.copy()
    start = np.zeros(n)
    end = np.zeros(n)
    stack = np.zeros(n + 1, dtype=np.int64)
    top = 0
    for t in range(n - 1, -1, -1):
        if waiting[t] == 0:
            stack[top] = t
            top += 1
    done = 0
    while top > 0:
        top -= 1
        t = stack[top]
        e = start[t] + d[t]
        end[t] = e
        done += 1
        for j in range(sp[t], sp[t + 1]):
            u = si[j]
            if e > start[u]:
                start[u] = e
            waiting[u] -= 1
            if waiting[u] == 0:
                stack[top] = u
                top += 1
    return start, end, done
