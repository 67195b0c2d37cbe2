"""Schedules of a task DAG without link contention: the two kernels behind the estimate.

Both kernels read the DAG as flat arrays (successor CSR, predecessor counts) and the contention-free
duration of every task, and return start and end times in seconds.

* :func:`list_schedule`: devices run their ready compute tasks one at a time, lowest priority
  first (the simulator's rule), transfers start when their predecessors end. It is an event-driven
  list scheduler: compute tasks become *ready* at the latest end of their predecessors; a device
  that is free when a task becomes ready starts it at once; otherwise the task waits and, when the
  device frees, the lowest ``(priority, task)`` among the tasks ready by then starts. Ties are
  inclusive: a task that becomes ready at the very instant a device frees competes for it.
* :func:`earliest_schedule`: every task starts when its predecessors end (no device serialises
  anything): the DAG's critical path, a lower bound on any schedule.

Each has a pure-Python implementation and, when numba is installed, a compiled one with the same
arithmetic and the same tie-breaking, so the two agree bit for bit. ``backend`` picks one:
``"auto"`` (compiled when available), ``"python"`` or ``"numba"``.
"""

from __future__ import annotations

import heapq
import os

import numpy as np

from .events import EV_DEVICE, EV_READY

__all__ = ["list_schedule", "earliest_schedule", "BACKENDS", "have_numba", "EV_READY", "EV_DEVICE"]

BACKENDS = ("auto", "python", "numba")

_NUMBA: object | None = None  # the compiled module, False when unavailable


def have_numba() -> bool:
    """True when the compiled kernels can be used (numba importable, not disabled by
    ``MARSSIM_NO_NUMBA=1``)."""
    return _compiled() is not None


def _compiled():
    global _NUMBA
    if _NUMBA is None:
        if os.environ.get("MARSSIM_NO_NUMBA", "") not in ("", "0"):
            _NUMBA = False
        else:
            try:
                from . import _numba_kernels
            except ImportError:
                _NUMBA = False
            else:
                _NUMBA = _numba_kernels
    return _NUMBA or None


PYTHON_TASKS = 50_000
"""``auto`` schedules in Python while the tasks it has scheduled so in this process stay within
this many: a process that estimates little is done before the compiled kernels would be loaded
from numba's cache (about a second); one that estimates more (a search) goes compiled."""

_python_tasks = 0


def _pick(backend: str, n: int | None = None):
    global _python_tasks
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "python":
        return None
    if backend == "auto" and n is not None and _python_tasks + n <= PYTHON_TASKS:
        _python_tasks += n
        return None
    compiled = _compiled()
    if compiled is None and backend == "numba":
        raise RuntimeError("backend 'numba' requested but numba is not installed (pip install numba, a dependency "
                           "of marssim)")
    return compiled


def list_schedule(duration: np.ndarray, device: np.ndarray, priority: np.ndarray, succ_ptr: np.ndarray,
                  succ_idx: np.ndarray, n_pred: np.ndarray, n_devices: int, *,
                  backend: str = "auto") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(start, ready, end)`` in seconds of every task under list scheduling.

    ``duration``: seconds per task. ``device``: dense device index ``0..n_devices-1`` of compute
    tasks, ``-1`` for transfers (which never wait for anything but their predecessors).
    ``priority``: lower runs first among tasks waiting on one device (ties: lower task index).
    ``succ_ptr``/``succ_idx``: successors in CSR form; ``n_pred``: predecessor count per task
    (an edge listed twice counts twice, as in the simulator). Raises ValueError on a cycle."""
    n = int(duration.shape[0])
    compiled = _pick(backend, n)
    if compiled is not None:
        start, ready, end, done = compiled.list_schedule(
            np.ascontiguousarray(duration, dtype=np.float64), np.ascontiguousarray(device, dtype=np.int64),
            np.ascontiguousarray(priority, dtype=np.int64), np.ascontiguousarray(succ_ptr, dtype=np.int64),
            np.ascontiguousarray(succ_idx, dtype=np.int64), np.ascontiguousarray(n_pred, dtype=np.int64),
            int(n_devices))
    else:
        start, ready, end, done = _list_schedule_py(duration, device, priority, succ_ptr, succ_idx, n_pred,
                                                    int(n_devices))
    if done != n:
        raise ValueError(f"the task graph has a cycle ({n - done} tasks never become ready)")
    return start, ready, end


def earliest_schedule(duration: np.ndarray, succ_ptr: np.ndarray, succ_idx: np.ndarray, n_pred: np.ndarray, *,
                      backend: str = "auto") -> tuple[np.ndarray, np.ndarray]:
    """``(start, end)`` with every task starting when its predecessors end (seconds)."""
    n = int(duration.shape[0])
    compiled = _pick(backend, n)
    if compiled is not None:
        start, end, done = compiled.earliest_schedule(
            np.ascontiguousarray(duration, dtype=np.float64), np.ascontiguousarray(succ_ptr, dtype=np.int64),
            np.ascontiguousarray(succ_idx, dtype=np.int64), np.ascontiguousarray(n_pred, dtype=np.int64))
    else:
        start, end, done = _earliest_schedule_py(duration, succ_ptr, succ_idx, n_pred)
    if done != n:
        raise ValueError(f"the task graph has a cycle ({n - done} tasks never become ready)")
    return start, end


# ---------------------------------------------------------------------- pure Python
def _list_schedule_py(duration, device, priority, succ_ptr, succ_idx, n_pred, n_devices):
    n = int(duration.shape[0])
    d = duration.tolist()
    dev = device.tolist()
    prio = priority.tolist()
    sp = succ_ptr.tolist()
    si = succ_idx.tolist()
    waiting = n_pred.tolist()
    ready = [0.0] * n
    start = [0.0] * n
    end = [0.0] * n
    free_at = [0.0] * n_devices
    queue: list[list] = [[] for _ in range(n_devices)]
    pending = [False] * n_devices  # a decision event is scheduled for the device
    events: list[tuple] = []  # (time, kind, priority, task or device): EV_READY or EV_DEVICE
    heappush = heapq.heappush
    heappop = heapq.heappop
    stack = [t for t in range(n - 1, -1, -1) if waiting[t] == 0]
    done = 0
    while True:
        # Transfers (and compute tasks becoming ready) are resolved eagerly: a transfer's end is
        # known as soon as its last predecessor's is; a compute task becomes a ready event.
        while stack:
            t = stack.pop()
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
                        stack.append(u)
            else:
                heappush(events, (ready[t], EV_READY, prio[t], t))
        if not events:
            break
        now, kind, p, x = heappop(events)
        if kind == EV_READY:
            v = dev[x]
            if free_at[v] <= now and not queue[v]:
                t = x
            else:
                heappush(queue[v], (p, x))
                if not pending[v]:
                    pending[v] = True
                    heappush(events, (free_at[v] if free_at[v] > now else now, EV_DEVICE, 0, v))
                continue
        else:
            v = x
            t = heappop(queue[v])[1]
            pending[v] = bool(queue[v])
        e = now + d[t]
        start[t] = now
        end[t] = e
        free_at[v] = e
        done += 1
        if pending[v]:
            heappush(events, (e, EV_DEVICE, 0, v))
        for j in range(sp[t], sp[t + 1]):
            u = si[j]
            if e > ready[u]:
                ready[u] = e
            waiting[u] -= 1
            if waiting[u] == 0:
                stack.append(u)
    return np.asarray(start), np.asarray(ready), np.asarray(end), done


def _earliest_schedule_py(duration, succ_ptr, succ_idx, n_pred):
    n = int(duration.shape[0])
    d = duration.tolist()
    sp = succ_ptr.tolist()
    si = succ_idx.tolist()
    waiting = n_pred.tolist()
    start = [0.0] * n
    end = [0.0] * n
    stack = [t for t in range(n - 1, -1, -1) if waiting[t] == 0]
    done = 0
    while stack:
        t = stack.pop()
        e = start[t] + d[t]
        end[t] = e
        done += 1
        for j in range(sp[t], sp[t + 1]):
            u = si[j]
            if e > start[u]:
                start[u] = e
            waiting[u] -= 1
            if waiting[u] == 0:
                stack.append(u)
    return np.asarray(start), np.asarray(end), done
