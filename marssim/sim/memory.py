"""Device and host memories as SimPy Containers of bytes.

Weights are put in at the start and stay; buffers are put when a task starts and taken when
the last task that reads them ends. What happens when a buffer does not fit is the *policy*:
``error`` raises :class:`~marssim.errors.CapacityError` naming the device, the time, the bytes
needed and the capacity; ``spill`` places the buffer in host DRAM instead (the engine then moves
it over the host link, out after it is produced and back before each reader). Units: bytes.
"""

from __future__ import annotations

import simpy

from marssim.errors import CapacityError

__all__ = ["MemoryPool", "POLICIES"]

POLICIES = ("error", "spill")


class MemoryPool:
    """One memory: a :class:`simpy.Container` with peak tracking and an occupancy timeline."""

    def __init__(self, env: simpy.Environment, name: str, capacity: float, resident: float = 0.0,
                 *, record: bool = False) -> None:
        self.env = env
        self.name = name
        self.capacity = float(capacity)
        if resident > self.capacity:
            raise CapacityError(name, 0.0, resident, self.capacity, "weights alone exceed the memory")
        # a hair of slack so that float rounding never leaves a put pending
        self.container = simpy.Container(env, capacity=self.capacity * (1 + 1e-9), init=float(resident))
        self.resident = float(resident)
        self.peak = float(resident)
        self.record = record
        self.timeline: list[tuple[float, float]] = [(0.0, float(resident))] if record else []

    @property
    def level(self) -> float:
        return self.container.level

    def fits(self, nbytes: float) -> bool:
        return self.container.level + nbytes <= self.capacity * (1 + 1e-12)

    def allocate(self, nbytes: float, what: str = "") -> None:
        """Put ``nbytes`` in; raises CapacityError when it does not fit (callers check ``fits``
        first under the spill policy)."""
        if not self.fits(nbytes):
            raise CapacityError(self.name, self.env.now, self.container.level + nbytes, self.capacity, what)
        self.container.put(nbytes)
        level = self.container.level
        if level > self.peak:
            self.peak = level
        if self.record:
            self.timeline.append((self.env.now, level))

    def release(self, nbytes: float) -> None:
        """Take ``nbytes`` out (a buffer's last reader has ended)."""
        amount = min(nbytes, self.container.level)
        if amount > 0:
            self.container.get(amount)
        if self.record:
            self.timeline.append((self.env.now, self.container.level))
