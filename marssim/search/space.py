"""The space of mappings the search explores, as a two-level genome.

Level 1 (MARS's outer level): how the accelerators are partitioned into sets (contiguous runs
of the system's accelerator order, so that a set's devices are neighbours on the interconnect),
the design of each set, where the layer sequence is cut into segments, which set runs each
segment, and the number of micro-batches. The segment-to-set assignment is free: any set may
take any segment, several segments (consecutive or not), or none; so a model of a multi-model
workload can go to the set whose design suits it, two models can share a set or split one, and
a pipeline may return to a set it left. Level 2 (inner): the sharding strategy of each layer; the
non-GEMM ops of a layer follow its strategy where legal (else data parallel, else ``none``).

:meth:`MappingSpace.decode` repairs any genome into a valid :class:`~marssim.mapping.Mapping`
(sets split where no common design exists, sets beyond ``max_sets`` dropped with their
accelerators left idle, designs clamped, boundaries and assignments cleaned), so every operator
of a search can work on genomes freely. Decoding is canonical, so equivalent genomes decode to
one mapping and are simulated once: the mapping lists only the sets that run something (in
accelerator order), neighbouring segments on one set are one stage, and layers on a one-device
set are ``none`` (every strategy runs the whole layer there).

Layer ``l``'s set is a function of ``l``; the segments are its runs. So the mappings of the
space are exactly: any collection of disjoint contiguous runs of accelerators that each share a
design, a design for each, any assignment of layers to them that uses every one, a sharding per
layer (``none`` on one device) and a micro-batch count. H2H's mappings (every layer whole on one
accelerator) are the special case of one-device sets.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np

from marssim.mapping import AcceleratorSet, Mapping, legal_strategies
from marssim.mapping.systemref import canonical_system_ref
from marssim.system import System
from marssim.workload import Graph

__all__ = ["Genome", "MappingSpace", "runs_of"]


@dataclass(frozen=True, slots=True)
class Genome:
    """A point of the mapping space.

    cuts: ``len(accelerators) - 1`` flags; ``cuts[i]`` ends a set after accelerator ``i``.
    designs: one design name per set (repaired to an allowed one on decode).
    boundaries: increasing layer indices where segments 1, 2, ... start.
    micro_batches: micro-batches of the pipeline.
    shardings: one strategy per layer (level 2).
    assignment: the set index of each segment (``len(boundaries) + 1`` entries; indices are
        taken modulo the number of sets). Empty: the pipeline layout, exactly one segment per
        set in set order (``boundaries`` repaired to one fewer than the sets).
    """

    cuts: tuple[bool, ...]
    designs: tuple[str, ...]
    boundaries: tuple[int, ...]
    micro_batches: int
    shardings: tuple[str, ...]
    assignment: tuple[int, ...] = field(default=())

    @property
    def n_sets(self) -> int:
        return 1 + sum(self.cuts)

    def level1(self) -> tuple:
        """The outer-level part (everything but the shardings)."""
        return (self.cuts, self.designs, self.boundaries, self.assignment, self.micro_batches)


def runs_of(labels) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """``(boundaries, values)`` of the maximal runs of equal values in ``labels``: the indices
    where runs 1, 2, ... start and the value of each run."""
    labels = [int(x) for x in labels]
    if not labels:
        return (), ()
    bounds = tuple(i for i in range(1, len(labels)) if labels[i] != labels[i - 1])
    return bounds, tuple(labels[b] for b in (0, *bounds))


class MappingSpace:
    """Mappings of ``graph`` onto ``system``: encode, decode and sample genomes.

    ``max_sets`` bounds the number of sets the accelerators are partitioned into (default: one
    per accelerator); ``micro_batch_choices`` lists the allowed micro-batch counts (values above
    the batch are dropped); ``strategies`` restricts the sharding strategies searched (default:
    every legal one; a layer with none of them left runs ``none``); ``collective_algorithm`` is
    passed to every mapping."""

    def __init__(self, graph: Graph, system: System, *, max_sets: int | None = None,
                 micro_batch_choices: tuple[int, ...] = (1, 2, 4, 8), strategies: tuple[str, ...] | None = None,
                 collective_algorithm: str = "auto") -> None:
        self.graph = graph
        self.system = system
        self.accelerators = system.accelerator_ids
        self.layers = graph.layers
        self.n_layers = len(self.layers)
        limit = len(self.accelerators)
        self.max_sets = max(1, min(max_sets or limit, limit))
        # a training step pipelines micro-batches through a parallel configuration, not a per-op mapping
        self.micro_batch_choices = (1,) if graph.training else (
            tuple(sorted({int(m) for m in micro_batch_choices if 1 <= m <= graph.batch})) or (1,))
        self.strategies = tuple(strategies) if strategies is not None else None
        self.collective_algorithm = collective_algorithm
        self._position = {gi: k for k, gi in enumerate(graph.compute_ops)}
        self.system_ref = canonical_system_ref(system)
        self._allowed: dict[tuple[str, ...], tuple[str, ...]] = {}
        self._sets: dict[tuple[bool, ...], list[tuple[str, ...]]] = {}

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
    def _layer_ops(self) -> tuple[tuple[tuple[int, tuple[str, ...]], ...], ...]:
        """Per layer: (position in ``compute_ops``, legal strategies) of each of its ops."""
        return tuple(tuple((self._position[gi], legal_strategies(self.graph.ops[gi])) for gi in layer)
                     for layer in self.layers)

    @cached_property
    def layer_flops(self) -> np.ndarray:
        return np.array([sum(self.graph.ops[i].flops for i in layer) for layer in self.layers], dtype=float)

    @cached_property
    def model_starts(self) -> tuple[int, ...]:
        """Layer indices where a model other than the first begins (multi-model workloads)."""
        models = [self.graph.ops[layer[0]].model for layer in self.layers]
        return tuple(i for i in range(1, self.n_layers) if models[i] != models[i - 1])

    def allowed_designs(self, devices: tuple[str, ...]) -> tuple[str, ...]:
        """Designs every device of ``devices`` may take, in the first device's order."""
        hit = self._allowed.get(devices)
        if hit is None:
            common = set(self.system.accelerator(devices[0]).designs)
            for d in devices[1:]:
                common &= set(self.system.accelerator(d).designs)
            hit = self._allowed[devices] = tuple(d for d in self.system.accelerator(devices[0]).designs if d in common)
        return hit

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
        """The sets a genome with these cuts partitions the accelerators into: :meth:`sets_of`,
        of which at most ``max_sets`` are kept (the accelerators of the others stay idle)."""
        cuts = tuple(bool(c) for c in cuts)
        hit = self._sets.get(cuts)
        if hit is None:
            if len(self._sets) > 4096:
                self._sets.clear()
            hit = self._sets[cuts] = self.sets_of(cuts)[: self.max_sets]
        return hit

    # ------------------------------------------------------------------ decode
    def segments(self, genome: Genome, n_sets: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """The repaired ``(boundaries, assignment)`` of a genome whose cuts give ``n_sets`` sets.

        Without an assignment: ``n_sets - 1`` boundaries (out-of-range and repeated ones
        dropped, extra ones cut from the end, missing ones taken from a balanced split) and
        segment ``i`` on set ``i``. With one: boundaries out of range or repeated dropped, then
        as many segments as both genes describe (extra boundaries cut from the end), each
        assignment taken modulo ``n_sets``."""
        if not genome.assignment:
            bounds = self._repair_boundaries(genome.boundaries, n_sets)
            return bounds, tuple(range(len(bounds) + 1))
        b = sorted({int(x) for x in genome.boundaries if 0 < int(x) < self.n_layers})
        b = b[: len(genome.assignment) - 1]
        return tuple(b), tuple(int(a) % n_sets for a in genome.assignment[: len(b) + 1])

    def layer_sets(self, genome: Genome) -> tuple[list[tuple[str, ...]], np.ndarray]:
        """``(sets, labels)``: the accelerator sets of the genome's partition and, per layer,
        the index of the set that runs it (sets no layer names are unused)."""
        sets = self.decoded_sets(genome.cuts)
        bounds, assign = self.segments(genome, len(sets))
        seg = np.searchsorted(np.asarray(bounds, dtype=int), np.arange(self.n_layers), side="right")
        return sets, np.asarray(assign, dtype=int)[seg]

    def set_design(self, genome: Genome, sets: list[tuple[str, ...]], i: int) -> str:
        """The design set ``i`` decodes to: the genome's where allowed, else the first allowed."""
        allowed = self.allowed_designs(sets[i])
        want = genome.designs[i] if i < len(genome.designs) else None
        return want if want in allowed else allowed[0]

    def decode(self, genome: Genome) -> Mapping:
        """The valid mapping a genome stands for (repairs designs, segments and strategies)."""
        sets, labels = self.layer_sets(genome)
        used = sorted(set(labels.tolist()))
        index = {s: k for k, s in enumerate(used)}
        out_sets = tuple(AcceleratorSet(sets[s], self.set_design(genome, sets, s)) for s in used)
        n_ops = len(self.graph.compute_ops)
        op_set = [0] * n_ops
        op_shard = ["none"] * n_ops
        for li, ops in enumerate(self._layer_ops):
            s = int(labels[li])
            k = index[s]
            if len(sets[s]) == 1:
                strategy = "none"
            else:
                want = genome.shardings[li] if li < len(genome.shardings) else "dp"
                lead = self.layer_strategies[li]
                strategy = want if want in lead else ("dp" if "dp" in lead else lead[0])
            for pos, legal in ops:
                op_set[pos] = k
                op_shard[pos] = strategy if strategy in legal else ("dp" if "dp" in legal else "none")
        micro = genome.micro_batches if genome.micro_batches in self.micro_batch_choices else self.micro_batch_choices[0]
        return Mapping(sets=out_sets, op_set=tuple(op_set), op_sharding=tuple(op_shard), micro_batches=micro,
                       collective_algorithm=self.collective_algorithm, system=self.system_ref,
                       workload=self.graph.spec)

    def _repair_boundaries(self, bounds: tuple[int, ...], k: int) -> tuple[int, ...]:
        """Exactly ``min(k, n_layers) - 1`` increasing boundaries in ``1..n_layers-1``:
        out-of-range and repeated ones dropped, extra ones cut from the end, missing ones taken
        from a balanced split."""
        k = min(k, self.n_layers)
        b = sorted({int(x) for x in bounds if 0 < int(x) < self.n_layers})[: max(k - 1, 0)]
        if len(b) < k - 1:
            fill = [x for x in self.balanced_boundaries([1.0] * k) if x not in b]
            fill += [x for x in range(1, self.n_layers) if x not in b and x not in fill]
            b = sorted(b + fill[: k - 1 - len(b)])
        return tuple(b)

    def balanced_boundaries(self, weights: list[float]) -> tuple[int, ...]:
        """Cut the layers so that segment ``i`` gets a share of the FLOPs proportional to
        ``weights[i]`` (e.g. the set's peak MAC/s); every segment gets at least one layer (at
        most ``n_layers`` segments)."""
        k = min(len(weights), self.n_layers)
        if k <= 1:
            return ()
        cum = np.cumsum(self.layer_flops)
        total = cum[-1] if cum[-1] > 0 else 1.0
        w = np.asarray(weights[:k], dtype=float)
        targets = np.cumsum(w)[:-1] / float(w.sum()) * total
        out: list[int] = []
        for j, target in enumerate(targets):
            b = int(np.searchsorted(cum, target, side="left")) + 1
            low = (out[-1] + 1) if out else 1
            high = self.n_layers - (k - 1 - j)
            out.append(min(max(b, low), high))
        return tuple(out)

    # ------------------------------------------------------------------ sample and encode
    def random(self, rng: np.random.Generator) -> Genome:
        """A uniformly drawn number of sets, random cuts and designs, FLOP-balanced then
        jittered segments (one per set; half the time between one and twice as many, or, for
        a multi-model workload, one per model), each on its set in order or on a random set,
        random micro-batches and shardings."""
        n_acc = len(self.accelerators)
        k = int(rng.integers(1, self.max_sets + 1))
        cut_at = rng.choice(n_acc - 1, size=k - 1, replace=False) if k > 1 else []
        cuts = tuple(i in set(int(c) for c in cut_at) for i in range(n_acc - 1))
        sets = self.decoded_sets(cuts)
        designs = tuple(str(rng.choice(self.allowed_designs(s))) for s in sets)
        n_sets = len(sets)
        shape = rng.random()
        if shape < 0.5 or n_sets == 1:  # one segment per set, in set order (a pipeline)
            bounds = self.balanced_boundaries([len(s) * float(rng.uniform(0.5, 1.5)) for s in sets])
            assign = tuple(range(len(bounds) + 1))
        else:
            if self.model_starts and shape < 0.75:
                bounds = self.model_starts
            else:
                n_seg = int(rng.integers(1, 2 * n_sets + 1))
                bounds = self.balanced_boundaries([float(rng.uniform(0.5, 1.5)) for _ in range(n_seg)])
            assign = tuple(int(x) for x in rng.integers(n_sets, size=len(bounds) + 1))
        shard = tuple(str(rng.choice(opts)) if opts else "none" for opts in self.layer_strategies)
        micro = int(rng.choice(self.micro_batch_choices))
        return Genome(cuts, designs, bounds, micro, shard, assign)

    def uniform(self, k_sets: int, design: str | None = None, sharding: str = "dp", micro_batches: int = 1) -> Genome:
        """``k_sets`` equal contiguous sets, FLOP-balanced segments (segment ``i`` on set
        ``i``), one strategy everywhere."""
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
        return Genome(cuts, designs, bounds, micro, shard, tuple(range(len(bounds) + 1)))

    def encode(self, mapping: Mapping) -> Genome:
        """The genome of a mapping whose sets are each a run of consecutive accelerators (in
        the accelerator order; sets in any order, accelerators may be left out). Raises
        ValueError otherwise, or when the partition needs more than ``max_sets`` sets.

        The accelerators no set holds form sets of their own, which the genome leaves unused.
        Each layer goes to its first op's set and strategy; the segments are the maximal runs of
        layers on one set. ``decode(encode(m)) == m`` for every decoded mapping (H2H's mappings
        among them); other mappings decode to their nearest point of the space: sets that run
        nothing dropped, sets renumbered in accelerator order, each layer's ops on its first
        op's set and strategy, ``none`` on one device."""
        order = {a: i for i, a in enumerate(self.accelerators)}
        for s in mapping.sets:
            if not s.devices or any(d not in order for d in s.devices):
                raise ValueError("a set is empty or names a device that is not an accelerator")
        labels = []
        shard = []
        for layer in self.layers:
            pos = self._position[layer[0]]
            labels.append(mapping.op_set[pos])
            shard.append(mapping.op_sharding[pos])
        return self.genome_of([s.devices for s in mapping.sets], [s.design for s in mapping.sets], labels,
                              mapping.micro_batches, shard)

    def genome_of(self, sets, designs, labels, micro_batches: int, shardings) -> Genome:
        """The genome of a mapping given as its sets (device tuples, each a run of consecutive
        accelerators), their designs, the set index of every layer, micro-batches and per-layer
        strategies. Raises ValueError when a set is not such a run, sets overlap, a set's
        devices share no design, or the partition needs more than ``max_sets`` sets."""
        order = {a: i for i, a in enumerate(self.accelerators)}
        n_acc = len(self.accelerators)
        owner = [-1] * n_acc
        for j, devices in enumerate(sets):
            idx = [order[d] for d in devices]
            if not idx or idx != list(range(idx[0], idx[0] + len(idx))):
                raise ValueError("a set is not a run of consecutive accelerators in the accelerator order")
            for i in idx:
                if owner[i] >= 0:
                    raise ValueError("sets overlap")
                owner[i] = j
        # a cut wherever the owning set changes; the accelerators of no set form sets of their own
        cuts = tuple(owner[i] != owner[i + 1] for i in range(n_acc - 1))
        partition = self.sets_of(cuts)
        index = {}
        for p, devices in enumerate(partition):
            j = owner[order[devices[0]]]
            if j >= 0:
                if tuple(devices) != tuple(sets[j]):
                    raise ValueError(f"the devices of set {j} share no design")
                index[j] = p
        part_labels = [index[int(j)] for j in labels]
        if max(part_labels, default=0) >= self.max_sets:
            raise ValueError(f"the mapping needs {max(part_labels) + 1} sets in the accelerator partition, "
                             f"more than {self.max_sets}")
        partition = partition[: self.max_sets]
        genome_designs = [self.allowed_designs(s)[0] for s in partition]
        for j, p in index.items():
            if p < len(partition):
                genome_designs[p] = designs[j]
        bounds, assign = runs_of(part_labels)
        return Genome(cuts, tuple(genome_designs), bounds, int(micro_batches), tuple(shardings), assign)

    def canonical(self, genome: Genome) -> Genome:
        """The genome of the genome's own mapping (its level-1 genes in canonical form)."""
        return self.encode(self.decode(genome))
