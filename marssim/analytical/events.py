"""The kinds of event of the list schedule, shared by its pure-Python kernel
(:mod:`marssim.analytical.schedule`) and its compiled ones (``_numba_kernels``, ``_program_kernels``).

An event is ``(time in seconds, kind, priority, x)``; at equal times the lower kind comes first."""

from __future__ import annotations

__all__ = ["EV_READY", "EV_DEVICE"]

EV_READY = 0
"""An event of the list schedule: a task becomes ready (its ``x`` is the task). At equal times a
task's readiness comes before a device's decision, so the device chooses among all tasks ready
then."""
EV_DEVICE = 1
"""An event of the list schedule: a device with queued tasks decides which runs next (its ``x``
is the device)."""
