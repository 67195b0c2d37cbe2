"""The space of mappings the search explores, as a two-level genome.

Level 1 (MARS's outer level): how the accelerators are partitioned into sets (contiguous runs
of the system's accelerator order, so neighbouring sets are neighbours on the interconnect), the
design of each set, where the layer sequence is cut into segments (segment ``i`` runs on set
``i``: pipeline stages, or side-by-side models in multi-model workloads) and the number of
micro-batches. Level 2 (inner): the sharding strategy of each layer; the non-GEMM ops of a
layer follow its strategy where legal (else data parallel, else ``none``).

:meth:`MappingSpace.decode` repairs any genome into a valid :class:`~marssim.mapping.Mapping`
(sets split where no common design exists, designs and boundaries clamped), so every operator
of a search can work on genomes freely.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property

import numpy as np

from marssim.mapping import AcceleratorSet, Mapping, legal_strategies
from marssim.mapping.io import canonical_system_ref
from marssim.system import System
from marssim.workload import Graph

__all__ = ["Genome", "MappingSpace"]


@dataclass(frozen=True, slots=True)
class Genome:
    """A point of the mapping space.

    cuts: ``len(accelerators) - 1`` flags; ``cuts[i]`` ends a set after accelerator ``i``.
    designs: one design name per set (repaired to an allowed one on decode).
    boundaries: increasing layer indices where segments 1, 2, ... start (one fewer than sets).
    micro_batches: micro-batches of the pipeline.
    shardings: one strategy per layer (level 2).
    """

    cuts: tuple[bool, ...]
    designs: tuple[str, ...]
    boundaries: tuple[int, ...]
    micro_batches: int
    shardings: tuple[str, ...]

    @property
    def n_sets(self) -> int:
        return 1 + sum(self.cuts)

    def level1(self) -> tuple:
        """The outer-level part (everything but the shardings)."""
        return (self.cuts, self.designs, self.boundaries, self.micro_batches)


class MappingSpace:
    """Mappings of ``graph`` onto ``system``: encode, decode and sample genomes.

    ``max_sets`` bounds the number of accelerator sets (default: all accelerators or all
    layers, whichever is fewer); ``micro_batch_choices`` lists the allowed micro-batch counts
    (values above the batch are dropped); ``collective_algorithm`` is passed to every mapping."""

    def __init__(self, graph: Graph, system: System, *, max_sets: int | None = None,
                 micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8), collective_algorithm: str = "auto") -> None:
        self.graph = graph
        self.system = system
        self.accelerators = system.accelerator_ids
        self.layers = graph.layers
        self.n_layers = len(self.layers)
        limit = min(len(self.accelerators), self.n_layers)
        self.max_sets = max(1, min(max_sets or limit, limit))
        self.micro_batch_choices = tuple(m for m in micro_batch_choices if 1 <= m <= graph.batch) or (1,)
        self.collective_algorithm = collective_algorithm
        self._position = {gi: k for k, gi in enumerate(graph.compute_ops)}
        self.system_ref = canonical_system_ref(system)

    # ------------------------------------------------------------------ structure
    @cached_property
    def layer_strategies(self) -> tuple[tuple[str, ...], ...]:
        """Legal strategies of each layer: those of its first (GEMM-like) op."""
        return tuple(legal_strategies(self.graph.ops[layer[0]]) for layer in self.layers)

    @cached_property
    def layer_flops(self) -> np.ndarray:
        return np.array([sum(self.graph.ops[i].flops for i in layer) for layer in self.layers], dtype=float)

    def allowed_designs(self, devices: tuple[str, ...]) -> tuple[str, ...]:
        """Designs every device of ``devices`` may take, in the first device's order."""
        common = set(self.system.accelerator(devices[0]).designs)
        for d in devices[1:]:
            common &= set(self.system.accelerator(d).designs)
        return tuple(d for d in self.system.accelerator(devices[0]).designs if d in common)

    def sets_of(self, cuts: tuple[bool, ...]) -> list[tuple[str, ...]]:
        """Contiguous runs of accelerators, split further where no design is common to a run."""
        runs: list[list[str]] = [[self.accelerators[0]]]
        for i, cut in enumerate(cuts):
            nxt = self.accelerators[i + 1]
            if cut or not self.allowed_designs(tuple(runs[-1] + [nxt])):
                runs.append([nxt])
            else:
                runs[-1].append(nxt)
        return [tuple(r) for r in runs]

    # ------------------------------------------------------------------ decode
    def decode(self, genome: Genome) -> Mapping:
        """The valid mapping a genome stands for (repairs designs, boundaries and strategies)."""
        sets = self.sets_of(genome.cuts)
        if len(sets) > self.n_layers:  # more sets than layers: merge the tail sets' devices away
            sets = sets[: self.n_layers]
        k = len(sets)
        designs = []
        for i, devices in enumerate(sets):
            allowed = self.allowed_designs(devices)
            want = genome.designs[i] if i < len(genome.designs) else None
            designs.append(want if want in allowed else allowed[0])
        bounds = self._repair_boundaries(genome.boundaries, k)
        stage_of_layer = np.searchsorted(np.asarray(bounds, dtype=int), np.arange(self.n_layers), side="right")
        op_set = [0] * len(self.graph.compute_ops)
        op_shard = ["none"] * len(self.graph.compute_ops)
        for li, layer in enumerate(self.layers):
            want = genome.shardings[li] if li < len(genome.shardings) else "dp"
            lead = self.layer_strategies[li]
            strategy = want if want in lead else ("dp" if "dp" in lead else "none")
            for gi in layer:
                pos = self._position[gi]
                op_set[pos] = int(stage_of_layer[li])
                legal = legal_strategies(self.graph.ops[gi])
                op_shard[pos] = strategy if strategy in legal else ("dp" if "dp" in legal else "none")
        micro = genome.micro_batches if genome.micro_batches in self.micro_batch_choices else self.micro_batch_choices[0]
        return Mapping(sets=tuple(AcceleratorSet(s, d) for s, d in zip(sets, designs)), op_set=tuple(op_set),
                       op_sharding=tuple(op_shard), micro_batches=micro,
                       collective_algorithm=self.collective_algorithm, system=self.system_ref,
                       workload=self.graph.spec)

    def _repair_boundaries(self, bounds: tuple[int, ...], k: int) -> tuple[int, ...]:
        """Exactly ``k - 1`` increasing boundaries in ``1..n_layers-1``: out-of-range and repeated
        ones dropped, extra ones cut from the end, missing ones taken from a balanced split."""
        b = sorted({int(x) for x in bounds if 0 < int(x) < self.n_layers})[: max(k - 1, 0)]
        if len(b) < k - 1:
            fill = [x for x in self.balanced_boundaries([1.0] * k) if x not in b]
            fill += [x for x in range(1, self.n_layers) if x not in b and x not in fill]
            b = sorted(b + fill[: k - 1 - len(b)])
        return tuple(b)

    def balanced_boundaries(self, weights: list[float]) -> tuple[int, ...]:
        """Cut the layers so that segment ``i`` gets a share of the FLOPs proportional to
        ``weights[i]`` (e.g. the set's peak MAC/s); every segment gets at least one layer."""
        k = len(weights)
        if k <= 1:
            return ()
        cum = np.cumsum(self.layer_flops)
        total = cum[-1] if cum[-1] > 0 else 1.0
        targets = np.cumsum(np.asarray(weights, dtype=float))[:-1] / float(sum(weights)) * total
        out: list[int] = []
        for j, target in enumerate(targets):
            b = int(np.searchsorted(cum, target, side="left")) + 1
            low = (out[-1] + 1) if out else 1
            high = self.n_layers - (k - 1 - j)
            out.append(min(max(b, low), high))
        return tuple(out)

    # ------------------------------------------------------------------ sample and encode
    def random(self, rng: np.random.Generator) -> Genome:
        """A uniformly drawn number of sets, random cuts, designs, balanced-then-jittered
        boundaries, micro-batches and shardings."""
        n_acc = len(self.accelerators)
        k = int(rng.integers(1, self.max_sets + 1))
        cut_at = rng.choice(n_acc - 1, size=k - 1, replace=False) if k > 1 else []
        cuts = tuple(i in set(int(c) for c in cut_at) for i in range(n_acc - 1))
        sets = self.sets_of(cuts)[: self.n_layers]
        designs = tuple(str(rng.choice(self.allowed_designs(s))) for s in sets)
        weights = [len(s) * float(rng.uniform(0.5, 1.5)) for s in sets]
        bounds = self.balanced_boundaries(weights)
        shard = tuple(str(rng.choice(opts)) if opts else "none" for opts in self.layer_strategies)
        micro = int(rng.choice(self.micro_batch_choices))
        return Genome(cuts, designs, bounds, micro, shard)

    def uniform(self, k_sets: int, design: str | None = None, sharding: str = "dp", micro_batches: int = 1) -> Genome:
        """``k_sets`` equal contiguous sets, FLOP-balanced segments, one strategy everywhere."""
        n_acc = len(self.accelerators)
        k = max(1, min(k_sets, self.max_sets))
        edges = {round(n_acc * j / k) - 1 for j in range(1, k)}
        cuts = tuple(i in edges for i in range(n_acc - 1))
        sets = self.sets_of(cuts)[: self.n_layers]
        designs = tuple(design if design in self.allowed_designs(s) else self.allowed_designs(s)[0] for s in sets)
        bounds = self.balanced_boundaries([float(len(s)) for s in sets])
        shard = tuple(sharding if sharding in opts else ("dp" if "dp" in opts else "none")
                      for opts in self.layer_strategies)
        micro = micro_batches if micro_batches in self.micro_batch_choices else self.micro_batch_choices[0]
        return Genome(cuts, designs, bounds, micro, shard)

    def encode(self, mapping: Mapping) -> Genome:
        """The genome of a mapping whose sets are contiguous runs in accelerator order and whose
        stages follow set order (e.g. any decoded mapping). Raises ValueError otherwise."""
        order = {a: i for i, a in enumerate(self.accelerators)}
        cuts = [False] * (len(self.accelerators) - 1)
        for s in mapping.sets[:-1]:
            idx = [order[d] for d in s.devices]
            if idx != list(range(idx[0], idx[0] + len(idx))):
                raise ValueError("sets are not contiguous runs of the accelerator order")
            cuts[idx[-1]] = True
        layer_set = []
        shard = []
        for layer in self.layers:
            pos = self._position[layer[0]]
            layer_set.append(mapping.op_set[pos])
            shard.append(mapping.op_sharding[pos])
        if any(b < a for a, b in zip(layer_set, layer_set[1:])):
            raise ValueError("stages do not follow set order")
        bounds = tuple(li for li in range(1, self.n_layers) if layer_set[li] != layer_set[li - 1])
        return Genome(tuple(cuts), tuple(s.design for s in mapping.sets), bounds, mapping.micro_batches, tuple(shard))

    def with_shardings(self, genome: Genome, shardings: tuple[str, ...]) -> Genome:
        return replace(genome, shardings=tuple(shardings))
