"""Device and host memories: capacities in bytes, filled and emptied as the simulation runs.

Weights are put in at the start and stay; buffers are put when a task starts and taken when
the last task that reads them ends. What happens when a buffer does not fit is the *policy*:
``error`` raises :class:`~marssim.errors.CapacityError` naming the device, the time, the bytes
needed and the capacity; ``spill`` places the buffer in host DRAM instead (the engine then moves
it over the host link, out after it is produced and back before each reader). Units: bytes.

A pool never makes a task wait (a buffer fits or the policy decides at once), so it is plain
accounting on the simulation clock rather than a SimPy ``Container``, whose put and get
events would only add two immediately-triggered events per buffer (a third of all events of a
large simulation) without changing any outcome.
"""

from __future__ import annotations

from collections.abc import Callable

import simpy

from marssim.errors import CapacityError

__all__ = ["MemoryPool", "POLICIES"]

POLICIES = ("error", "spill", "ignore")
"""``ignore``: buffers always fit (the peak is still recorded), for runs whose peak is reported
against the capacity rather than enforced."""


class MemoryPool:
    """One memory: its level (bytes in use), peak, and with ``record`` an occupancy timeline."""

    __slots__ = ("env", "name", "capacity", "_limit", "level", "resident", "peak", "record", "timeline")

    def __init__(self, env: simpy.Environment, name: str, capacity: float, resident: float = 0.0,
                 *, record: bool = False) -> None:
        self.env = env
        self.name = name
        self.capacity = float(capacity)
        if resident > self.capacity:
            raise CapacityError(name, None, resident, self.capacity, "weights alone exceed the memory")
        self._limit = self.capacity * (1 + 1e-12)  # a hair of slack for float rounding
        self.level = float(resident)
        self.resident = float(resident)
        self.peak = float(resident)
        self.record = record
        self.timeline: list[tuple[float, float]] = [(0.0, float(resident))] if record else []

    def fits(self, nbytes: float) -> bool:
        return self.level + nbytes <= self._limit

    def allocate(self, nbytes: float, what: str | Callable[[], str] = "") -> None:
        """Put ``nbytes`` in; raises CapacityError when it does not fit (callers check ``fits``
        first under the spill policy). ``what`` (or a function returning it, called only on
        error) says what the bytes are."""
        level = self.level + nbytes
        if level > self._limit:
            raise CapacityError(self.name, self.env.now, level, self.capacity, what() if callable(what) else what)
        self.level = level
        if level > self.peak:
            self.peak = level
        if self.record:
            self.timeline.append((self.env.now, level))

    def release(self, nbytes: float) -> None:
        """Take ``nbytes`` out (a buffer's last reader has ended)."""
        level = self.level
        if nbytes < level:
            self.level = level - nbytes
        elif level > 0:  # the buffer is all that is left
            self.level = 0.0
        if self.record:
            self.timeline.append((self.env.now, self.level))
