"""What a validation compares and reports: named mappings, one mapping's comparison, a user's
estimates. Units: seconds."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from marssim.mapping.named import NamedMapping

__all__ = ["NamedMapping", "Comparison", "UserEstimates", "resolve_name"]


_TOP = 3  # resources named per mapping


@dataclass(frozen=True)
class Comparison:
    """One mapping evaluated both ways (seconds). ``error``: ``(estimate - simulated) / simulated``
    (NaN when the mapping does not fit memory: ``feasible`` False, ``problem`` says why).
    ``delays``: seconds of the simulated critical path charged to each resource (links, switches,
    memories by name; ``device order`` for what contention-free ordering does not explain).
    ``op_sim_s``/``op_est_s``: simulated and estimated seconds per op (see :func:`op_times`;
    filled only when per-layer estimates are compared)."""

    name: str
    key: str
    family: str
    sets: int
    stages: int
    micro_batches: int
    tasks: int
    estimate_s: float
    simulated_s: float
    lower_bound_s: float
    error: float
    bounded_s: float = math.nan
    feasible: bool = True
    problem: str = ""
    estimate_wall_s: float = 0.0
    simulate_wall_s: float = 0.0
    link_delay_s: float = 0.0  # extra seconds of all transfers over their contention-free time
    wait_s: float = 0.0  # seconds compute tasks spent ready but waiting for their device, simulated
    wait_estimate_s: float = 0.0  # the same in the estimate
    delays: dict[str, float] = field(default_factory=dict)
    op_sim_s: dict[str, float] = field(default_factory=dict)
    op_est_s: dict[str, float] = field(default_factory=dict)

    @property
    def top_resources(self) -> str:
        """The resources that explain most of the gap, with their share: ``a->b 71%; c:mem 20%``."""
        total = sum(self.delays.values())
        if total <= 0:
            return ""
        top = sorted(self.delays.items(), key=lambda kv: (-kv[1], kv[0]))[:_TOP]
        return "; ".join(f"{name} {value / total:.0%}" for name, value in top)


@dataclass(frozen=True)
class UserEstimates:
    """A user's own numbers read from a CSV: per mapping (``makespan_s`` by mapping name or key)
    or per layer (``time_s`` by op name, optionally per mapping)."""

    file: str
    kind: str  # "mapping" or "layer"
    makespan: dict[str, float] = field(default_factory=dict)  # mapping name/key -> s
    layers: tuple[tuple[str, str, float, int], ...] = ()  # (mapping or "", op, s, csv row)


def resolve_name(ref: str, names: Sequence[str], by_key: dict[str, str]) -> str | None:
    """The mapping a user's reference names: a mapping name, or a prefix (6+ hex digits) of
    exactly one mapping's key. None when it names none."""
    if ref in names:
        return ref
    hits = [name for key, name in by_key.items() if len(ref) >= 6 and key.startswith(ref.lower())]
    return hits[0] if len(hits) == 1 else None
