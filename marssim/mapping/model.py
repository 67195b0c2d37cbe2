"""The :class:`Mapping` value: accelerator sets, their designs, op -> set, sharding per op.

A mapping is immutable and hashable (the search caches fitness by :meth:`Mapping.key`). Its
per-op tuples follow the order of ``graph.compute_ops`` of the workload it was made for; runs
of consecutive ops on one set are the pipeline stages.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from functools import cached_property

from marssim.errors import InputError, summarise_names
from marssim.system import System
from marssim.workload import Graph

from .sharding import STRATEGIES, legal_strategies
from .systemref import canonical_system_ref

__all__ = ["AcceleratorSet", "Mapping", "ALGORITHMS", "validate_mapping", "mapping_problems"]

ALGORITHMS = ("auto", "ring", "direct", "halving_doubling")
"""Collective algorithms: ``auto`` picks per collective the cheapest by a congestion-aware
alpha-beta estimate over the system's routes."""


@dataclass(frozen=True, slots=True)
class AcceleratorSet:
    """Devices that work together on the ops assigned to them, all configured with ``design``.
    ``devices`` are in ring order (the order ring collectives use)."""

    devices: tuple[str, ...]
    design: str


@dataclass(frozen=True)
class Mapping:
    """A complete mapping of a workload onto a system.

    Attributes:
        sets: the accelerator sets (a partition of some or all accelerators).
        op_set: for each compute op (``graph.compute_ops`` order), the index of its set.
        op_sharding: for each compute op, its strategy name (see ``mapping.sharding``).
        micro_batches: the batch is split into this many micro-batches that flow through the
            pipeline stages one after another.
        collective_algorithm: ``auto``, ``ring``, ``direct`` or ``halving_doubling``.
        system: the system file (or shipped name) the mapping was made for.
        workload: the workload spec, batch included (``resnet50:batch=8``).
    """

    sets: tuple[AcceleratorSet, ...]
    op_set: tuple[int, ...]
    op_sharding: tuple[str, ...]
    micro_batches: int = 1
    collective_algorithm: str = "auto"
    system: str = ""
    workload: str = ""
    set_names: tuple[str, ...] = field(default=(), compare=False)

    @cached_property
    def key(self) -> str:
        """A stable content hash (hex) of everything that affects evaluation."""
        text = repr((self.sets, self.op_set, self.op_sharding, self.micro_batches, self.collective_algorithm,
                     self.system, self.workload))
        return hashlib.sha1(text.encode()).hexdigest()

    def __hash__(self) -> int:
        return hash(self.key)

    @property
    def n_stages(self) -> int:
        """Number of pipeline stages: runs of consecutive ops on the same set."""
        if not self.op_set:
            return 0
        return 1 + sum(1 for a, b in zip(self.op_set[:-1], self.op_set[1:]) if a != b)

    def with_(self, **changes) -> "Mapping":
        """A copy with fields replaced (the mapping itself is immutable)."""
        return replace(self, **changes)

    # ------------------------------------------------------------------ constructors
    @classmethod
    def single_set(cls, graph: Graph, system: System, *, devices: tuple[str, ...] | None = None,
                   design: str | None = None, sharding: str | tuple[str, ...] = "dp", micro_batches: int = 1,
                   collective_algorithm: str = "auto") -> "Mapping":
        """Every op on one set (all accelerators by default), one design, ``sharding`` where legal
        (a tuple gives preferences, first legal wins; ``none`` otherwise)."""
        devices = tuple(devices or system.accelerator_ids)
        design = design or _common_design(system, devices)
        prefs = (sharding,) if isinstance(sharding, str) else tuple(sharding)
        shard = tuple(_first_legal(graph.ops[i], prefs) for i in graph.compute_ops)
        return cls(sets=(AcceleratorSet(devices, design),), op_set=(0,) * len(shard), op_sharding=shard,
                   micro_batches=micro_batches, collective_algorithm=collective_algorithm,
                   system=canonical_system_ref(system), workload=graph.spec)

    @classmethod
    def pipeline(cls, graph: Graph, system: System, sets: list[AcceleratorSet], boundaries: list[int],
                 sharding: str | tuple[str, ...] = "dp", micro_batches: int = 1,
                 collective_algorithm: str = "auto") -> "Mapping":
        """Consecutive layer segments on consecutive sets: ``boundaries`` are the indices (into
        ``graph.layers``) where stages 1, 2, ... begin."""
        if len(boundaries) != len(sets) - 1:
            raise ValueError("need one boundary fewer than sets")
        prefs = (sharding,) if isinstance(sharding, str) else tuple(sharding)
        stage_of_layer = []
        stage = 0
        for li in range(len(graph.layers)):
            while stage < len(boundaries) and li >= boundaries[stage]:
                stage += 1
            stage_of_layer.append(stage)
        position = {op: k for k, op in enumerate(graph.compute_ops)}
        op_set = [0] * len(graph.compute_ops)
        for li, layer in enumerate(graph.layers):
            for op in layer:
                op_set[position[op]] = stage_of_layer[li]
        shard = tuple(_first_legal(graph.ops[i], prefs) for i in graph.compute_ops)
        return cls(sets=tuple(sets), op_set=tuple(op_set), op_sharding=shard, micro_batches=micro_batches,
                   collective_algorithm=collective_algorithm, system=canonical_system_ref(system),
                   workload=graph.spec)


def _first_legal(op, prefs: tuple[str, ...]) -> str:
    legal = legal_strategies(op)
    for p in prefs:
        if p in legal:
            return p
    return "none"


def _common_design(system: System, devices: tuple[str, ...]) -> str:
    allowed = set(system.accelerator(devices[0]).designs)
    for d in devices[1:]:
        allowed &= set(system.accelerator(d).designs)
    if not allowed:
        raise ValueError(f"no design is allowed by all of {', '.join(devices)}")
    first = system.accelerator(devices[0]).designs
    return next(d for d in first if d in allowed)


def mapping_problems(mapping: Mapping, graph: Graph, system: System) -> list[tuple[str, str]]:
    """Every violation as ``(key path, message)``; empty when the mapping is valid."""
    problems: list[tuple[str, str]] = []
    owner: dict[str, int] = {}
    if not mapping.sets:
        problems.append(("sets", "expected at least one accelerator set"))
    for i, s in enumerate(mapping.sets):
        if not s.devices:
            problems.append((f"sets[{i}].devices", "expected at least one device"))
        unknown: list[str] = []
        shared: dict[int, list[str]] = {}
        refused: dict[tuple[str, ...], list[str]] = {}
        for dev in s.devices:
            if not system.is_accelerator(dev):
                unknown.append(dev)
                continue
            if dev in owner:
                shared.setdefault(owner[dev], []).append(dev)
            else:
                owner[dev] = i
            if s.design in system.designs and s.design not in system.accelerator(dev).designs:
                refused.setdefault(tuple(system.accelerator(dev).designs), []).append(dev)
        if unknown:
            what = f"device {unknown[0]!r}" if len(unknown) == 1 else \
                f"{len(unknown)} devices ({summarise_names(unknown)})"
            problems.append((f"sets[{i}].devices", f"unknown {what}; expected accelerators of {system.name} "
                                                   f"({summarise_names(system.accelerator_ids, contiguous=True)})"))
        for other, devs in shared.items():
            problems.append((f"sets[{i}].devices", f"{summarise_names(devs)} already in sets[{other}]; "
                                                   "sets must not overlap"))
        for allowed, devs in refused.items():
            problems.append((f"sets[{i}].design", f"design {s.design!r} is not allowed on {summarise_names(devs)} "
                                                  f"(allowed: {', '.join(allowed)})"))
        if s.design not in system.designs:
            problems.append((f"sets[{i}].design", f"unknown design {s.design!r}; expected one of: {', '.join(system.designs)}"))
    n_ops = len(graph.compute_ops)
    if len(mapping.op_set) != n_ops or len(mapping.op_sharding) != n_ops:
        problems.append(("assign", f"expected an assignment for each of the {n_ops} ops of {graph.name}, "
                                   f"got {len(mapping.op_set)}"))
        return problems
    illegal: dict[str, list] = {}  # strategy -> ops that cannot take it
    for k, gi in enumerate(graph.compute_ops):
        op = graph.ops[gi]
        s = mapping.op_set[k]
        if not 0 <= s < len(mapping.sets):
            problems.append((f"ops.{op.name}.set", f"unknown set {s}; expected 0..{len(mapping.sets) - 1}"))
        strat = mapping.op_sharding[k]
        if strat not in STRATEGIES:
            problems.append((f"ops.{op.name}.sharding", f"unknown sharding {strat!r}; expected one of: {', '.join(STRATEGIES)}"))
        elif strat not in legal_strategies(op):
            illegal.setdefault(strat, []).append(op)
    for strat, ops in illegal.items():
        key = f"ops.{ops[0].name}.sharding" if len(ops) == 1 else "ops"
        whose = f"{ops[0].kind} op {ops[0].name}" if len(ops) == 1 else \
            f"{len(ops)} ops ({summarise_names([op.name for op in ops])})"
        problems.append((key, f"sharding {strat!r} is illegal for {whose}; legal for {ops[0].name}: "
                              f"{', '.join(legal_strategies(ops[0]))}"))
    if mapping.micro_batches < 1:
        problems.append(("micro_batches", f"expected a positive integer, got {mapping.micro_batches}"))
    elif mapping.micro_batches > graph.batch:
        problems.append(("micro_batches", f"expected at most the batch ({graph.batch}), got {mapping.micro_batches}"))
    elif mapping.micro_batches > 1 and graph.training:
        problems.append(("micro_batches", "a training step takes 1 in a per-op mapping (its optimizer runs once); "
                                          f"got {mapping.micro_batches}: give a parallel configuration for "
                                          "gradient accumulation over micro-batches"))
    if mapping.collective_algorithm not in ALGORITHMS:
        problems.append(("collective_algorithm", f"expected one of {', '.join(ALGORITHMS)}, got {mapping.collective_algorithm!r}"))
    return problems


def validate_mapping(mapping: Mapping, graph: Graph, system: System, file: str | None = None) -> Mapping:
    """Raise InputError naming every violation; return the mapping when valid."""
    problems = mapping_problems(mapping, graph, system)
    if problems:
        raise InputError(file or "<mapping>", problems=problems)
    return mapping
