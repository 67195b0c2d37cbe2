"""ZeRO stage 3 as DeepSpeed runs it (PyTorch FSDP alike): parameters partitioned over the
data-parallel group and all-gathered module by module, just before each module runs.

DeepSpeed's parameter coordinator (``deepspeed/runtime/zero/partitioned_param_coordinator.py``)
does, at every module's pre-forward (and pre-backward) hook:

1. fetch: all-gather the module's parameters unless they are available already, and wait for them;
2. prefetch: walking the modules that come next in the recorded order, all-gather those not
   available, while fewer than ``min(stage3_max_live_parameters - available,
   stage3_prefetch_bucket_size)`` elements are being prefetched (so at least one module when that
   is positive);
3. after the module ran: release (re-partition) its parameters unless the same module runs again
   within ``stage3_max_reuse_distance`` elements of other modules' parameters.

Parameters with fewer than ``stage3_param_persistence_threshold`` elements stay gathered (they are
never all-gathered per use). Gradients are reduce-scattered in buckets of ``reduce_bucket_size``
elements as the backward produces them; the optimizer updates each rank's partition, and nothing is
gathered after the step (the next forward gathers what it needs).

Here a *module* is an op of the graph that holds weights (a linear layer, a norm, an embedding;
its weights and bias one parameter); backward and recomputation ops use the weights of the forward
op they name (``shares``), and consecutive ops of one module are one *use* of it. The gathers of a
unit (a chunk's forward or backward pass) are planned statically by the rules above
(:func:`plan_unit`); each unit starts with nothing gathered. The lowering issues each gather when
the kernel before its issuing use has ended (a fetch: the use itself; a prefetch: the use whose hook
prefetched it, once that use's own parameters are there), one after another on the data-parallel
communicator, and a module's kernels wait for its gather.

A gather over data-parallel ranks of several classes of identical GPUs (:mod:`.fold`) is, in the
TaskGraph the simulator runs, at most :data:`RING_ROWS` transfers per rank of consecutive ring
steps, each waiting for the previous rank's transfer before it (a task per step would make a
2,560-GPU run's hundreds of gathers per pass millions of tasks); while the ranks run in lockstep
that is the time of a task per step. ``marssim estimate``'s lowering (``coupled_rings``) couples
every step.

Settings (:class:`Zero3Settings`, from :class:`~.config.ParallelConfig`): ``zero3_prefetch``,
``zero3_live``, ``zero3_persist``, ``zero3_reuse``, ``zero3_bucket``, in parameters (elements),
with DeepSpeed's defaults.

Units: elements (parameters), bytes, seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from marssim.workload import Graph, Op, OpKind
from marssim.workload.llm import require_transformer

from .config import ParallelConfig
from .memo import graph_cached
from .partition import chunk_layers, rules_key, shard_weights, stage_of_layers

__all__ = ["RING_ROWS", "Gather", "UnitPlan", "Use", "Zero3Settings", "live_bytes", "module_of", "module_params", "plan_unit",
           "unit_plans", "unit_seconds", "unit_uses"]

RING_ROWS = 64
"""The most transfers per rank of one parameter all-gather over several GPU classes (see above)."""


@dataclass(frozen=True)
class Zero3Settings:
    """DeepSpeed's ZeRO-3 settings, in parameters (elements): ``prefetch``
    (``stage3_prefetch_bucket_size``), ``live`` (``stage3_max_live_parameters``), ``persist``
    (``stage3_param_persistence_threshold``), ``reuse`` (``stage3_max_reuse_distance``),
    ``bucket`` (``reduce_bucket_size``)."""

    prefetch: int = 50_000_000
    live: int = 1_000_000_000
    persist: int = 100_000
    reuse: int = 1_000_000_000
    bucket: int = 500_000_000

    @classmethod
    def of(cls, cfg: ParallelConfig) -> Zero3Settings:
        return cls(cfg.zero3_prefetch, cfg.zero3_live, cfg.zero3_persist, cfg.zero3_reuse, cfg.zero3_bucket)


@dataclass(frozen=True)
class Use:
    """One use of a module in a unit: the module (its forward op's name), the parameters one rank
    gathers for it (elements), the index of its first op in the unit's ops, and whether it is
    persistent (never gathered)."""

    module: str
    params: int
    first: int
    persistent: bool


@dataclass(frozen=True)
class Gather:
    """An all-gather of a module's parameters: it serves use ``use``, is issued at the hook of use
    ``issuer`` (``issuer == use``: a fetch the use waits for at once; ``issuer < use``: a
    prefetch), and gathers ``params`` elements."""

    use: int
    issuer: int
    params: int


@dataclass(frozen=True)
class UnitPlan:
    """A unit's uses, its gathers in issue order, for every use the gather whose parameters it
    reads (``source``, an index into ``gathers``; -1: persistent, or none), and the most
    parameters gathered at once (``peak``, elements, persistent ones not counted)."""

    uses: tuple[Use, ...]
    gathers: tuple[Gather, ...]
    source: tuple[int, ...]
    peak: int

    @property
    def gathered(self) -> int:
        """Elements all-gathered over the unit."""
        return sum(g.params for g in self.gathers)


def module_of(op: Op) -> str | None:
    """The module whose weights ``op`` reads: the forward op it names (``shares``), itself for a
    forward op with weights, else None."""
    shares = op.param("shares")
    if shares:
        return str(shares)
    if op.weight_elems and op.param("phase", "fwd") == "fwd":
        return op.name
    return None


def module_params(graph: Graph, cfg: ParallelConfig, rules) -> dict[str, int]:
    """Per module (forward op with weights): the elements of its weights one rank holds before
    partitioning (split by its tensor-parallel rule, as :func:`.memory.rank_parameters` splits
    them); a module whose weights another holds (a tied output layer) has the owner's."""
    stage_of = stage_of_layers(require_transformer(graph, "a parallel configuration").layers, cfg)
    out: dict[str, int] = {}
    for op in graph.ops:
        if op.param("phase", "fwd") != "fwd" or not op.weight_elems or op.param("shares"):
            continue
        out[op.name] = int(shard_weights(op, rules[op.name], cfg.tp_of(stage_of[op.param("layer")])))
    return out


def unit_uses(ops: Sequence[Op], params: dict[str, int], persist: int) -> list[Use]:
    """The uses of modules by ``ops`` (a unit's, in order): consecutive ops of one module (ops
    without weights between them) are one use; ``params``: :func:`module_params`; a module with
    fewer than ``persist`` elements is persistent."""
    uses: list[Use] = []
    for i, op in enumerate(ops):
        name = module_of(op)
        if name is None or name not in params:
            continue
        if uses and uses[-1].module == name:
            continue
        n = params[name]
        uses.append(Use(name, n, i, n < persist))
    return uses


def plan_unit(uses: Sequence[Use], s: Zero3Settings) -> UnitPlan:
    """The gathers of a unit whose modules are used as ``uses``, by DeepSpeed's fetch, prefetch
    and release rules (see the module docstring)."""
    available: dict[str, bool] = {}
    fetched_for: dict[str, int] = {}  # the last use a module's gather was made for
    last_gather: dict[str, int] = {}
    gathers: list[Gather] = []
    source: list[int] = []
    live = peak = 0
    queue = 0  # the next use the prefetcher has not passed

    def gather(k: int, issuer: int) -> None:
        nonlocal live
        u = uses[k]
        available[u.module] = True
        fetched_for[u.module] = k
        last_gather[u.module] = len(gathers)
        gathers.append(Gather(k, issuer, u.params))
        live += u.params

    for i, u in enumerate(uses):
        queue = max(queue, i + 1)
        if u.persistent:
            source.append(-1)
        else:
            if not available.get(u.module):
                gather(i, i)
            source.append(last_gather[u.module])
        budget = min(s.live - live, s.prefetch)
        taken = 0
        while queue < len(uses) and taken < budget:
            v = uses[queue]
            if not v.persistent and not available.get(v.module):
                gather(queue, i)
                taken += v.params
            elif not v.persistent:
                fetched_for[v.module] = max(fetched_for[v.module], queue)
            queue += 1
        peak = max(peak, live)
        if u.persistent or fetched_for.get(u.module, -1) > i:
            continue
        distance, again = 0, False
        for v in uses[i + 1:]:
            if distance >= s.reuse:
                break
            if v.module == u.module:
                again = True
                break
            distance += v.params
        if not again:
            available[u.module] = False
            live -= u.params
    return UnitPlan(tuple(uses), tuple(gathers), tuple(source), peak)


def unit_seconds(plan: UnitPlan, prelude: float, compute: Sequence[float], gather: Sequence[float]) -> float:
    """Seconds of a unit run as the lowering runs it, alone on its links: ``prelude`` seconds of
    kernels before the first use, ``compute[i]`` seconds of kernels from use ``i``'s first op to
    the next use's, ``gather[k]`` seconds of gather ``k`` (one after another on the communicator,
    each issued when the kernel before its issuing use has ended and, for a prefetch, that use's
    own parameters are there)."""
    clock = prelude
    comm = 0.0
    done = [0.0] * len(plan.gathers)
    issued: dict[int, list[int]] = {}
    for k, g in enumerate(plan.gathers):
        issued.setdefault(g.issuer, []).append(k)
    for i in range(len(plan.uses)):
        ready = clock
        for k in issued.get(i, ()):
            if plan.gathers[k].use == i:  # this use's own fetch
                comm = max(comm, clock) + gather[k]
                done[k] = comm
        if plan.source[i] >= 0:
            ready = max(ready, done[plan.source[i]])
        for k in issued.get(i, ()):
            if plan.gathers[k].use != i:  # the prefetches, once this use's parameters are there
                comm = max(comm, ready) + gather[k]
                done[k] = comm
        clock = ready + compute[i]
    return clock


def unit_plans(graph: Graph, cfg: ParallelConfig, rules, unit_ops: dict) -> dict:
    """Per unit key (chunk, ``F`` or ``B``) of ``unit_ops``: its :class:`UnitPlan` (memoised with
    the graph by the rules and settings)."""
    s = Zero3Settings.of(cfg)
    rk = rules_key(cfg, stage_of_layers(require_transformer(graph, "a parallel configuration").layers, cfg))
    key = ("zero3 plans", rk, s, tuple(sorted((k, len(v)) for k, v in unit_ops.items())))

    def make() -> dict:
        params = module_params(graph, cfg, rules)
        return {k: plan_unit(unit_uses(ops, params, s.persist), s) for k, ops in unit_ops.items() if k[1] in "FB"}

    return graph_cached(graph, key, make)


def live_bytes(graph: Graph, cfg: ParallelConfig, rules, stage: int, param_bytes: float, grad_bytes: float) -> float:
    """Bytes of one rank of ``stage`` beyond its partitions under ZeRO-3: the most parameters its
    units hold gathered at once (at most a use's own plus the live limit), its persistent
    parameters (whole on every rank) at ``param_bytes`` each, and one gradient bucket (at most
    the stage's parameters) at ``grad_bytes`` each."""
    t = require_transformer(graph, "a parallel configuration")
    chunks = chunk_layers(t.layers, cfg)
    key = ("zero3 live bytes", rules_key(cfg, stage_of_layers(t.layers, cfg)), chunks, Zero3Settings.of(cfg), stage,
           param_bytes, grad_bytes)
    return graph_cached(graph, key, lambda: _live_bytes(graph, cfg, rules, stage, param_bytes, grad_bytes, chunks))


def _live_bytes(graph: Graph, cfg: ParallelConfig, rules, stage: int, param_bytes: float, grad_bytes: float,
                chunks) -> float:
    chunk_of = {layer: c for c, layers in enumerate(chunks) for layer in layers}
    unit_ops: dict = {}
    for op in graph.ops:
        phase = op.param("phase", "fwd")
        if op.kind == OpKind.INPUT or phase == "opt" or chunk_of[op.param("layer")] % cfg.pp != stage:
            continue
        unit_ops.setdefault((chunk_of[op.param("layer")], "F" if phase == "fwd" else "B"), []).append(op)
    plans = unit_plans(graph, cfg, rules, unit_ops)
    s = Zero3Settings.of(cfg)
    peak = max((p.peak for p in plans.values()), default=0)
    params = module_params(graph, cfg, rules)
    layers = {layer for layer, c in chunk_of.items() if c % cfg.pp == stage}
    owned = {op.name for op in graph.ops if op.name in params and op.param("layer") in layers}
    persistent = sum(params[m] for m in owned if params[m] < s.persist)
    stage_params = sum(params[m] for m in owned)
    return peak * param_bytes + persistent * param_bytes + min(s.bucket, stage_params) * grad_bytes
