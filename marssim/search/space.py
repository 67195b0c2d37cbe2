"""The space of mappings the search explores, as a two-level genome.

Level 1 (MARS's outer level): how the accelerators are partitioned into sets (contiguous runs
of the system's accelerator order, so neighbouring sets are neighbours on the interconnect), the
design of each set, where the layer sequence is cut into segments (segment ``i`` runs on set
``i``: pipeline stages, or side-by-side models in multi-model workloads) and the number of
micro-batches. Level 2 (inner): the sharding strategy of each layer; the non-GEMM ops of a
layer follow its strategy where legal (else data parallel, else ``none``).

:meth:`MappingSpace.decode` repairs any genome into a valid :class:`~marssim.mapping.Mapping`
(sets split where no common design exists, sets beyond ``max_sets`` dropped with their
accelerators left idle, designs and boundaries clamped), so every operator of a search can
work on genomes freely. Layers on a one-device set are canonically ``none`` (every strategy
runs the whole layer there), so equivalent genomes decode to one mapping and are simulated once.
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
    (values above the batch are dropped); ``strategies`` restricts the sharding strategies
    searched (default: every legal one; a layer with none of them left runs ``none``);
    ``collective_algorithm`` is passed to every mapping."""

    def __init__(self, graph: Graph, system: System, *, max_sets: int | None = None,
                 micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8), strategies: tuple[str, ...] | None = None,
                 collective_algorithm: str = "auto") -> None:
        self.graph = graph
        self.system = system
        self.accelerators = system.accelerator_ids
        self.layers = graph.layers
        self.n_layers = len(self.layers)
        limit = min(len(self.accelerators), self.n_layers)
        self.max_sets = max(1, min(max_sets or limit, limit))
        self.micro_batch_choices = tuple(sorted({int(m) for m in micro_batch_choices if 1 <= m <= graph.batch})) or (1,)
        self.strategies = tuple(strategies) if strategies is not None else None
        self.collective_algorithm = collective_algorithm
        self._position = {gi: k for k, gi in enumerate(graph.compute_ops)}
        self.system_ref = canonical_system_ref(system)

    # ------------------------------------------------------------------ structure
    @cached_property
    def layer_strategies(self) -> tuple[tuple[str, ...], ...]:
        """Strategies searched for each layer: the legal ones of its first (GEMM-like) op, less
        those ``strategies`` excludes (``("none",)`` when nothing is left)."""
        out = []
        for layer in self.layers:
            legal = legal_strategies(self.graph.ops[layer[0]])
            if self.strategies is not None:
                legal = tuple(x for x in legal if x in self.strategies) or ("none",)
            out.append(legal or ("none",))
        return tuple(out)

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

    def decoded_sets(self, cuts: tuple[bool, ...]) -> list[tuple[str, ...]]:
        """The sets a genome with these cuts decodes to: :meth:`sets_of`, of which at most
        ``max_sets`` are kept (the accelerators of the others stay idle)."""
        return self.sets_of(cuts)[: self.max_sets]

    # ------------------------------------------------------------------ decode
    def decode(self, genome: Genome) -> Mapping:
        """The valid mapping a genome stands for (repairs designs, boundaries and strategies)."""
        sets = self.decoded_sets(genome.cuts)
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
            stage = int(stage_of_layer[li])
            want = genome.shardings[li] if li < len(genome.shardings) else "dp"
            lead = self.layer_strategies[li]
            if len(sets[stage]) == 1:
                strategy = "none"
            else:
                strategy = want if want in lead else ("dp" if "dp" in lead else lead[0])
            for gi in layer:
                pos = self._position[gi]
                op_set[pos] = stage
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
        sets = self.decoded_sets(cuts)
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
        sets = self.decoded_sets(cuts)
        designs = tuple(design if design in self.allowed_designs(s) else self.allowed_designs(s)[0] for s in sets)
        bounds = self.balanced_boundaries([float(len(s)) for s in sets])
        shard = tuple(sharding if sharding in opts else ("dp" if "dp" in opts else "none")
                      for opts in self.layer_strategies)
        micro = micro_batches if micro_batches in self.micro_batch_choices else self.micro_batch_choices[0]
        return Genome(cuts, designs, bounds, micro, shard)

    def encode(self, mapping: Mapping) -> Genome:
        """The genome of a mapping whose sets are consecutive runs of the accelerator order,
        starting at the first accelerator, and whose layer segments follow set order, one or
        more layers per set. Raises ValueError otherwise. ``decode(encode(m)) == m`` for every
        decoded mapping; other mappings decode to their nearest point of the space (each
        layer's ops take its first op's strategy)."""
        order = {a: i for i, a in enumerate(self.accelerators)}
        cuts = [False] * (len(self.accelerators) - 1)
        nxt = 0
        for s in mapping.sets:
            if not s.devices or any(d not in order for d in s.devices):
                raise ValueError("a set is empty or names a device that is not an accelerator")
            idx = [order[d] for d in s.devices]
            if idx != list(range(nxt, nxt + len(idx))):
                raise ValueError("sets are not consecutive runs of the accelerator order")
            nxt = idx[-1] + 1
            if idx[-1] < len(cuts):
                cuts[idx[-1]] = True
        if len(mapping.sets) > self.max_sets:
            raise ValueError(f"the mapping has {len(mapping.sets)} sets, more than {self.max_sets}")
        layer_set = []
        shard = []
        for layer in self.layers:
            pos = self._position[layer[0]]
            layer_set.append(mapping.op_set[pos])
            shard.append(mapping.op_sharding[pos])
        if any(b < a for a, b in zip(layer_set, layer_set[1:])) or set(layer_set) != set(range(len(mapping.sets))):
            raise ValueError("stages do not follow set order, or a set has no layer")
        bounds = tuple(li for li in range(1, self.n_layers) if layer_set[li] != layer_set[li - 1])
        return Genome(tuple(cuts), tuple(s.design for s in mapping.sets), bounds, mapping.micro_batches, tuple(shard))

    def with_shardings(self, genome: Genome, shardings: tuple[str, ...]) -> Genome:
        return replace(genome, shardings=tuple(shardings))
