"""Lower a mapped workload to the TaskGraph both evaluators read. Pure and deterministic.

For every micro-batch and every op (graph order), the op is split into shards by its strategy
(``mapping.sharding``), one per device of its set; each shard becomes a compute task timed by
the cost model on the set's design. Each input of a shard is a *region* of its producer's
output tensor; the producer's output is held as regions by the producer's shards (a *layout*).
Moving data from the producer's layout to the regions the consumer's shards need is lowered as:

* nothing, where a device already holds what it needs;
* an all-gather (ring, halving-doubling or direct) when a split tensor is needed whole by the
  same set; an all-reduce or reduce-scatter when the producer left partial sums;
* otherwise point-to-point transfers of the exact region intersections, recorded as one
  collective of kind ``all_to_all`` (same set, another split), ``halo`` (same axis, overlapping
  windows), ``p2p`` (another set), ``broadcast`` or ``gather``.

A re-distribution is done once per (producer, micro-batch, needed regions) and shared by every
consumer that needs the same regions. Graph inputs come from the host nearest the consuming set,
micro-batch after micro-batch (micro-batch ``m`` of an input leaves once micro-batch ``m-1`` has
been sent, as a DMA queue streams them); graph outputs return to the host nearest their set. Weights of each device's shards are resident
for the run and loaded from the nearest host before it (``TaskGraph.setup``).

Speed: a collective or a re-distribution is added as a precomputed block of transfers
(:mod:`marssim.taskblocks`), memoised with everything else a search's lowerings share in a
:class:`LoweringCache`. When every op's batch splits evenly, micro-batches are alike: only
micro-batch 0 is lowered, and the others are copies of its tasks one period later each
(:meth:`TaskGraphBuilder.repeat_tail`), the same tasks a lowering of each would add.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

from marssim.cost.base import CostModel
from marssim.gcpause import gc_paused
from marssim.collectives.group import group_plan, plan_schedule
from marssim.collectives.schedules import choose_algorithm
from marssim.mapping.model import Mapping, validate_mapping
from marssim.mapping.sharding import (
    BATCH_DIM, Box, box_elems, full_box, intersect, shard_regions, split_dim, split_sizes,
)
from marssim.system import System
from marssim.taskblocks import TransferBlock, collective_block, emit_collective, emit_flows, flow_block
from marssim.taskblocks import unique as _unique
from marssim.taskgraph import Collective, OpInfo, TaskGraph, TaskGraphBuilder
from marssim.workload import Graph, Op, OpKind

__all__ = ["lower", "expand_collective", "LoweringCache"]


class _Holder(NamedTuple):
    device: str
    box: Box
    ready: tuple[int, ...]


class _Layout(NamedTuple):
    """Where a tensor lives: holder ``i`` is device ``sig[i][0]`` holding region ``sig[i][1]``,
    ready after tasks ``ready[i]``; ``sig_id``: the number :meth:`LoweringCache.number` gives
    ``sig`` (plans are keyed by it); ``partial``: holders hold partial sums of the same box;
    ``replicated``: every holder holds the whole tensor."""

    sig: tuple[tuple[str, Box], ...]
    ready: tuple[tuple[int, ...], ...]
    sig_id: int
    shape: tuple[int, int, int, int]
    elem_bytes: int
    partial: bool = False
    replicated: bool = False

    @property
    def holders(self) -> tuple[_Holder, ...]:
        return tuple(_Holder(d, box, r) for (d, box), r in zip(self.sig, self.ready))


class _Flow(NamedTuple):
    """A point-to-point piece of a re-distribution: holder ``holder`` sends ``nbytes`` bytes to
    device ``destination``."""

    holder: int
    destination: str
    nbytes: float


@dataclass(frozen=True, slots=True)
class _GatherMove:
    """A split tensor needed whole by exactly its holders: an all-gather over ``devices`` of
    ``chunks`` bytes each, ``total`` bytes in all."""

    devices: tuple[str, ...]
    chunks: list[float]
    total: float


@dataclass(frozen=True, slots=True)
class _DirectMove:
    """Any other re-distribution: per needing device (``order``) what it already holds
    (``local``: (device, holder index)) and the ``flows`` of more than 0 bytes, recorded as one
    collective of ``kind`` over ``devices`` moving ``total`` bytes (``any_flow``: whether there was
    any flow, empty ones included), ``block`` the flows as a :class:`TransferBlock`."""

    order: tuple[str, ...]
    local: tuple[tuple[str, int], ...]
    flows: tuple[_Flow, ...]
    kind: str
    devices: tuple[str, ...]
    total: float
    any_flow: bool
    block: TransferBlock


@dataclass(frozen=True, slots=True)
class _Sharded:
    """An op split over a set: the device of each shard, whether shards hold partial sums, the
    needs ``(device, region)`` of each input slot, the layout signature ``(device, output
    region)`` of the output and the weight bytes per shard ``(device, bytes)``; ``columns``: the
    shards' compute tasks as the arguments of :meth:`TaskGraphBuilder.computes` (node indices,
    seconds, FLOPs, joules, output bytes); ``need_ids``, ``sig_id``: the numbers
    :meth:`LoweringCache.number` gives each slot's needs and the signature; ``models``: the cost
    models that timed the shards (``OpCost.model``, in shard order, each once)."""

    devices: tuple[str, ...]
    partial: bool
    needs: tuple
    sig: tuple
    weights: tuple
    columns: tuple
    need_ids: tuple[int, ...]
    sig_id: int
    models: tuple[str, ...] = ()


class LoweringCache:
    """What lowerings of one workload on one system with one cost model share: the ops of each
    micro-batch size, shard timings and regions, collective schedules, and the plans of data
    movements (which holder sends which bytes to whom). Each is a pure function of its key, so a
    lowering gives the same TaskGraph with or without the cache; a search that lowers thousands
    of mappings of one workload passes one cache to every :func:`lower` call and skips most of
    the work. Cleared when it holds more than ``limit`` entries."""

    def __init__(self, graph: Graph, system: System, cost: CostModel, *, limit: int = 400_000) -> None:
        self.graph = graph
        self.system = system
        self.cost = cost
        self.limit = limit
        self.ops: dict[tuple[int, int, int], tuple[Op, int]] = {}
        self.shards: dict[tuple, tuple] = {}
        self.pieces: dict[tuple, tuple] = {}
        self.collectives: dict[tuple, tuple] = {}
        self.moves: dict[tuple, tuple] = {}
        self.designs: dict[tuple[str, str], object] = {}
        self.hosts: dict[str, str] = {}
        self.latency: dict[tuple[str, str], float] = {}
        self.numbers: dict[tuple, int] = {}
        self._op_labels: tuple[tuple[str, str, str, str], ...] | None = None

    def op_labels(self) -> tuple[tuple[str, str, str, str], ...]:
        """What the TaskGraph reports of each compute op that depends on the graph alone, in
        graph order: ``(name, kind, model, loops)`` (loops as ``"N=8 K=64 ..."``)."""
        if self._op_labels is None:
            ops = self.graph.ops
            self._op_labels = tuple((ops[gi].name, ops[gi].kind.value, ops[gi].model,
                                     " ".join(f"{k}={v}" for k, v in ops[gi].loops))
                                    for gi in self.graph.compute_ops)
        return self._op_labels

    def number(self, value: tuple) -> int:
        """A small integer standing for ``value`` (equal values, equal numbers) until the cache
        is cleared: cache keys hold it instead of ``value``, which is slow to hash."""
        n = self.numbers.get(value)
        if n is None:
            n = self.numbers[value] = len(self.numbers)
        return n

    def fits(self, graph: Graph, system: System, cost: CostModel) -> bool:
        """True when this cache was made for exactly these objects."""
        return graph is self.graph and system is self.system and cost is self.cost

    def trim(self) -> None:
        """Clear what has grown past the limit: the shard ops (which nothing else refers to)
        past ``limit / 40`` splits (each holds an op per shard, about 2 kB each); everything past
        ``limit`` entries, a collective counting one per transfer of its schedule."""
        if len(self.pieces) > self.limit // 40:
            self.pieces.clear()
        held = (len(self.shards) + len(self.moves) + len(self.ops) + len(self.numbers)
                + sum(len(block) for _, _, block in self.collectives.values()))
        if held > self.limit:
            self.ops.clear()
            self.shards.clear()
            self.pieces.clear()
            self.collectives.clear()
            self.moves.clear()
            self.numbers.clear()  # after everything keyed by the numbers


def lower(graph: Graph, system: System, mapping: Mapping, cost: CostModel | None = None, *,
          validate: bool = True, cache: LoweringCache | None = None) -> TaskGraph:
    """Turn a mapped workload into the tasks both evaluators read. Pure and deterministic.

    ``cost`` times each shard on its set's design (default: :func:`marssim.cost.default_cost_model`).
    ``cache``: a :class:`LoweringCache` made for this graph, system and cost model, shared by
    many lowerings (same result, less work). Raises InputError when ``mapping`` is invalid for
    ``graph`` and ``system``, ValueError when ``cache`` was made for other objects."""
    if validate:
        validate_mapping(mapping, graph, system)
    if cost is None:
        cost = cache.cost if cache is not None else None
    if cost is None:
        from marssim.cost import default_cost_model

        cost = default_cost_model()
    if cache is None:
        cache = LoweringCache(graph, system, cost)
    elif not cache.fits(graph, system, cost):
        raise ValueError("the LoweringCache was made for another graph, system or cost model")
    else:
        cache.trim()
    with gc_paused():
        return _Lowering(graph, system, mapping, cost, cache).run()


class _Lowering:
    def __init__(self, graph: Graph, system: System, mapping: Mapping, cost: CostModel,
                 cache: LoweringCache, repeat: bool = True) -> None:
        self.graph = graph
        self.system = system
        self.mapping = mapping
        self.cost = cost
        self.b = TaskGraphBuilder(system)
        self.position = {gi: k for k, gi in enumerate(graph.compute_ops)}
        self.n_ops = len(graph.ops)
        self.cache = cache
        self.repeat = repeat  # copy micro-batches after the first when they lower alike (same tasks)
        self._designs = cache.designs
        self._shard_cache = cache.shards
        self._redistributed: dict[tuple, dict[str, tuple[int, ...]]] = {}
        self._input_sent: dict[tuple[int, int], list[int]] = {}  # (input op, micro-batch) -> its transfers
        self._host_of = cache.hosts
        self._latency = cache.latency
        self._resident_inputs: set[int] = set()
        self._cost_models: list[tuple[str, ...] | None] = [None] * len(graph.compute_ops)  # per compute op

    # ------------------------------------------------------------------ helpers
    def design(self, device: str, name: str):
        key = (device, name)
        d = self._designs.get(key)
        if d is None:
            d = self._designs[key] = self.system.design(device, name)
        return d

    def host_for(self, device: str) -> str:
        h = self._host_of.get(device)
        if h is None:
            h = self._host_of[device] = self.system.nearest_host(device)
        return h

    def latency(self, a: str, b: str) -> float:
        key = (a, b)
        v = self._latency.get(key)
        if v is None:
            v = self._latency[key] = self.system.route(a, b).latency
        return v

    def op_for_mb(self, gi: int, mb: int) -> tuple[Op, int]:
        """The op of micro-batch ``mb`` and its batch size."""
        key = (gi, self.mapping.micro_batches, mb)
        hit = self.cache.ops.get(key)
        if hit is None:
            base = self.graph.ops[gi]
            dim = BATCH_DIM[base.kind]
            size = split_sizes(base.dim(dim), self.mapping.micro_batches)[mb]
            op = base if size == base.dim(dim) else base.with_loops(**{dim: size})
            hit = self.cache.ops[key] = (op, size)
        return hit

    def shards(self, gi: int, size: int, op: Op, strategy: str, devices: tuple[str, ...], design_name: str) -> _Sharded:
        """Op ``gi`` at batch ``size`` split by ``strategy`` over ``devices``, each shard timed
        on ``design_name`` (see :class:`_Sharded`)."""
        key = (gi, size, strategy, devices, design_name)
        hit = self._shard_cache.get(key)
        if hit is not None:
            return hit
        dim = split_dim(op, strategy)
        parts = self.pieces(gi, size, op, dim, len(devices))
        out = []
        partial = False
        models: dict[str, None] = {}
        for i, shard, out_box, in_boxes, is_partial in parts:
            dev = devices[i]
            c = self.cost.op_cost(shard, self.design(dev, design_name))
            out.append((dev, shard, out_box, in_boxes, c.time, c.energy))
            models[c.model] = None
            partial = partial or is_partial
        needs = tuple(tuple((dev, in_boxes[slot]) for dev, _, _, in_boxes, _, _ in out if box_elems(in_boxes[slot]) > 0)
                      for slot in range(len(op.inputs)))
        node = self.system.node_index
        out_bytes = 0 if op.param("view") else op.dtype_bytes  # a view holds no buffer of its own
        columns = (tuple(node[dev] for dev, *_ in out), tuple(float(seconds) for *_, seconds, _ in out),
                   tuple(float(shard.flops) for _, shard, *_ in out), tuple(float(energy) for *_, energy in out),
                   tuple(float(box_elems(out_box) * out_bytes) for _, _, out_box, *_ in out))
        sig = tuple((dev, out_box) for dev, _, out_box, *_ in out)
        number = self.cache.number
        owns = not op.param("shares")  # an op reading another op's weights adds none of its own
        result = _Sharded(tuple(dev for dev, *_ in out), partial and len(parts) > 1, needs, sig,
                          tuple((dev, shard.weight_bytes if owns else 0) for dev, shard, *_ in out), columns,
                          tuple(number(n) for n in needs), number(sig), tuple(models))
        self._shard_cache[key] = result
        return result

    def pieces(self, gi: int, size: int, op: Op, dim: str | None, n: int) -> tuple:
        """Op ``gi`` at batch ``size`` (``op``) with loop ``dim`` split into ``n`` parts (None:
        whole, on the first device): per non-empty part ``(index of the part, shard op, output
        region, input regions, partial)`` (see :func:`shard_regions`); memoised, as every set of
        ``n`` devices and every design splits alike."""
        key = (gi, size, dim, n)
        hit = self.cache.pieces.get(key)
        if hit is not None:
            return hit
        if dim is None:
            parts = [(0, op, *shard_regions(op, None, 0, 0))]
        else:
            parts = []
            lo = 0
            for i, part in enumerate(split_sizes(op.dim(dim), n)):
                if part > 0:
                    parts.append((i, op.with_loops(**{dim: part}), *shard_regions(op, dim, lo, lo + part)))
                lo += part
        hit = self.cache.pieces[key] = tuple(parts)
        return hit

    def choose(self, devices: tuple[str, ...], kind: str, chunks: list[float]) -> tuple[str, int, TransferBlock]:
        """The collective's algorithm, its number of steps and its transfers (see
        :func:`collective_block`), memoised: with ``auto`` on a group of a GPU cluster, NCCL's plan
        (:func:`marssim.collectives.group.group_plan`, as ring steps on the system's routes:
        :func:`~marssim.collectives.group.plan_schedule`), shared with the parallel lowering;
        elsewhere, or for an algorithm the mapping names, :func:`choose_algorithm`."""
        requested = self.mapping.collective_algorithm
        key = (devices, kind, tuple(chunks), requested)
        hit = self.cache.collectives.get(key)
        if hit is None:
            plan = group_plan(self.system, devices, kind, float(sum(chunks))) if requested == "auto" else None
            if plan is not None:
                algo, steps = plan.algorithm, plan_schedule(plan, self.system, devices)
            else:
                algo, steps = choose_algorithm(self.system, devices, kind, chunks, requested)
            block = collective_block(self.system, devices, steps, gather=kind != "reduce_scatter")
            hit = self.cache.collectives[key] = (algo, len(steps), block)
        return hit

    # ------------------------------------------------------------------ main loop
    def run(self) -> TaskGraph:
        g, m = self.graph, self.mapping
        layouts: dict[tuple[int, int], _Layout] = {}
        weights: dict[str, float] = {}
        for mb in range(m.micro_batches):
            if mb == 1 and self.repeat and _even_micro_batches(g, m.micro_batches):
                # every later micro-batch is micro-batch 0 again, one period later, its inputs
                # leaving after those of the micro-batch before
                self.b.repeat_tail(0, m.micro_batches - 1, priority_step=self.n_ops, collectives_from=0,
                                   carried=self._carried_inputs())
                break
            self._micro_batch(mb, layouts, weights)
        for dev in sorted(weights, key=self.system.node_index.__getitem__):
            if weights[dev] > 0:
                self.b.resident[dev] = weights[dev]
                self.b.setup.append((self.host_for(dev), dev, weights[dev]))
        for dev, nbytes in self._resident_bytes().items():  # KV caches: resident, not loaded from a host
            self.b.resident[dev] = self.b.resident.get(dev, 0.0) + nbytes
        meta = {
            "system": self.system.name, "workload": g.spec, "batch": g.batch, "micro_batches": m.micro_batches,
            "mapping": m.key[:12], "n_stages": m.n_stages, "set_design": [s.design for s in m.sets],
        }
        ops = tuple(OpInfo(name, kind, model, loops, shard, where, "+".join(timed or ()))
                    for (name, kind, model, loops), shard, where, timed
                    in zip(self.cache.op_labels(), m.op_sharding, m.op_set, self._cost_models))
        return self.b.build(meta, ops=ops, device_design={d: s.design for s in m.sets for d in s.devices},
                            batch=g.batch)

    def _carried_inputs(self) -> dict[int, tuple[int, ...]]:
        """After micro-batch 0: its tasks whose copy in micro-batch 1 waits for something else,
        the sends of each graph input (micro-batch 1 of an input leaves once micro-batch 0 has
        been sent), each mapped to the tasks its copy waits for."""
        carried: dict[int, tuple[int, ...]] = {}
        for sent in self._input_sent.values():
            for t in sent:
                carried[t] = tuple(sent)
        return carried

    def _micro_batch(self, mb: int, layouts: dict[tuple[int, int], _Layout], weights: dict[str, float]) -> None:
        """Add the tasks of micro-batch ``mb``: each op's shards after what they need of their
        producers (``layouts``: where each ``(op, micro-batch)`` output lives, filled in), then the
        graph outputs' return to a host. Micro-batch 0 adds each shard's weight bytes to
        ``weights`` (per device)."""
        g, m = self.graph, self.mapping
        for gi, base in enumerate(g.ops):
            op, size = self.op_for_mb(gi, mb)
            if base.kind == OpKind.INPUT and base.param("resident"):
                layouts[(gi, mb)] = self._resident_layout(gi, op)
                continue
            if base.kind == OpKind.INPUT:
                consumers = g.succs[gi]
                first_set = m.sets[m.op_set[self.position[consumers[0]]]] if consumers else m.sets[0]
                host = self.host_for(first_set.devices[0])
                # the host streams an input micro-batch by micro-batch: micro-batch mb leaves once
                # micro-batch mb-1 has been sent (a DMA queue), so the first stage is not starved
                sent = tuple(self._input_sent.get((gi, mb - 1), ()))
                sig = ((host, full_box(op.out_shape)),)
                layouts[(gi, mb)] = _Layout(sig, (sent,), self.cache.number(sig), op.out_shape,
                                            4 if g.succs[gi] and g.ops[g.succs[gi][0]].kind == OpKind.EMBEDDING
                                            else op.dtype_bytes)
                continue
            k = self.position[gi]
            aset = m.sets[m.op_set[k]]
            sharded = self.shards(gi, size, op, m.op_sharding[k], aset.devices, aset.design)
            timed = self._cost_models[k]
            if timed is not sharded.models:
                self._cost_models[k] = sharded.models if timed is None else _union(timed, sharded.models)
            if mb == 0:
                for dev, nbytes in sharded.weights:
                    weights[dev] = weights.get(dev, 0.0) + nbytes
            # inputs: what each shard needs from each producer
            deps: dict[str, list[int]] = {dev: [] for dev in sharded.devices}
            for slot, src in enumerate(g.preds[gi]):
                got = self.redistribute((src, mb), layouts[(src, mb)], sharded.needs[slot], sharded.need_ids[slot],
                                        base.name, mb)
                for dev, tasks in got.items():
                    deps[dev].extend(tasks)
            first = self.b.computes(*sharded.columns, [_unique(ts) for ts in deps.values()],
                                    priority=mb * self.n_ops + gi, op=base.name, micro_batch=mb)
            ready = tuple([(t,) for t in range(first, first + len(sharded.sig))])
            layouts[(gi, mb)] = _Layout(sharded.sig, ready, sharded.sig_id, op.out_shape, op.dtype_bytes,
                                        partial=sharded.partial)
        for gi in g.outputs:
            layout = layouts[(gi, mb)]
            needs = ((self.host_for(layout.sig[0][0]), full_box(layout.shape)),)
            self.redistribute((gi, mb), layout, needs, self.cache.number(needs), g.ops[gi].name, mb)

    def _resident_layout(self, gi: int, op: Op) -> _Layout:
        """A device-resident input (a KV cache): held whole by every device of the sets that
        read it, ready from the start; the bytes each device reads are resident memory."""
        g, m = self.graph, self.mapping
        devices = tuple(dict.fromkeys(d for s in g.succs[gi] for d in m.sets[m.op_set[self.position[s]]].devices))
        box = full_box(op.out_shape)
        sig = tuple((d, box) for d in devices)
        self._resident_inputs.add(gi)
        return _Layout(sig, ((),) * len(devices), self.cache.number(sig), op.out_shape, op.dtype_bytes,
                       replicated=True)

    def _resident_bytes(self) -> dict[str, float]:
        """Bytes of device-resident inputs per device: per input, the bounding box of the regions
        its readers on the device need (every micro-batch holds its own part)."""
        out: dict[str, float] = {}
        m = self.mapping
        for gi in sorted(self._resident_inputs):
            boxes: dict[str, list] = {}
            for s in self.graph.succs[gi]:
                k = self.position[s]
                aset = m.sets[m.op_set[k]]
                op, size = self.op_for_mb(s, 0)
                sharded = self.shards(s, size, op, m.op_sharding[k], aset.devices, aset.design)
                for slot, src in enumerate(self.graph.preds[s]):
                    if src != gi:
                        continue
                    for dev, need in sharded.needs[slot]:
                        cur = boxes.get(dev)
                        boxes[dev] = list(need) if cur is None else [
                            (min(a[0], b[0]), max(a[1], b[1])) for a, b in zip(cur, need)]
            eb = self.graph.ops[gi].dtype_bytes
            for dev, box in boxes.items():
                out[dev] = out.get(dev, 0.0) + box_elems(tuple(box)) * eb * m.micro_batches
        return out

    # ------------------------------------------------------------------ data movement
    def redistribute(self, key: tuple[int, int], layout: _Layout, needs: tuple[tuple[str, Box], ...], needs_id: int,
                     op_name: str, mb: int) -> dict[str, tuple[int, ...]]:
        """Tasks each needing device must wait for, after moving what it lacks (``needs``:
        ``(device, region)`` pairs, numbered ``needs_id`` by :meth:`LoweringCache.number`)."""
        if not needs:
            return {}
        cache_key = (key, needs_id)
        hit = self._redistributed.get(cache_key)
        if hit is not None:
            return hit
        if layout.partial:
            layout, done = self._reduce(layout, needs, op_name, mb)
            if done is not None:
                self._redistributed[cache_key] = done
                return done
        result = self._move(layout, needs, needs_id, op_name, mb)
        self._redistributed[cache_key] = result
        if self.graph.ops[key[0]].kind == OpKind.INPUT:
            sent = self._input_sent.setdefault(key, [])
            for tasks in result.values():
                sent.extend(tasks)
        return result

    def _emit(self, kind: str, devices: tuple[str, ...], chunks: list[float], initial: list[tuple[int, ...]],
              total_bytes: float, op_name: str, mb: int) -> list[tuple[int, ...]]:
        """Add collective ``kind`` of ``chunks`` (bytes per rank) on ``devices``; returns per rank
        the tasks after which its result is ready."""
        algo, n_steps, block = self.choose(devices, kind, chunks)
        coll = self.b.add_collective(Collective(kind, algo, devices, float(total_bytes), op_name, n_steps))
        return emit_collective(self.b, block, initial, coll, op_name, mb)

    def _reduce(self, layout: _Layout, needs, op_name: str, mb: int):
        """Resolve partial sums. Returns ``(new layout, None)`` or ``(layout, finished deps)``."""
        devices = tuple(d for d, _ in layout.sig)
        eb = layout.elem_bytes
        total = box_elems(layout.sig[0][1]) * eb
        need_devs = tuple(d for d, _ in needs)
        full = full_box(layout.shape)
        initial = list(layout.ready)
        same = set(need_devs) == set(devices) and len(need_devs) == len(devices)
        if same and all(box == full for _, box in needs):
            chunks = [float(s * eb) for s in split_sizes(box_elems(full), len(devices))]
            ready = self._emit("all_reduce", devices, chunks, initial, total, op_name, mb)
            return layout, {d: ready[i] for i, d in enumerate(devices)}
        if same and _disjoint_cover(needs, full):
            need_of = dict(needs)
            chunks = [float(box_elems(need_of[d]) * eb) for d in devices]
            ready = self._emit("reduce_scatter", devices, chunks, initial, total, op_name, mb)
            return layout, {d: ready[i] for i, d in enumerate(devices)}
        # Reduce-scatter along the longest axis into an even split, then move as usual.
        axis = max(range(4), key=lambda a: (layout.shape[a], -a))
        sizes = split_sizes(layout.shape[axis], len(devices))
        boxes = []
        lo = 0
        for size in sizes:
            parts = list(full)
            parts[axis] = (lo, lo + size)
            boxes.append(tuple(parts))
            lo += size
        chunks = [float(box_elems(b) * eb) for b in boxes]
        ready = self._emit("reduce_scatter", devices, chunks, initial, total, op_name, mb)
        kept = [i for i in range(len(devices)) if box_elems(boxes[i]) > 0]
        sig = tuple((devices[i], boxes[i]) for i in kept)
        return _Layout(sig, tuple(ready[i] for i in kept), self.cache.number(sig), layout.shape, eb), None

    def _move(self, layout: _Layout, needs, needs_id: int, op_name: str, mb: int) -> dict[str, tuple[int, ...]]:
        ready = layout.ready
        key = (layout.sig_id, layout.shape, layout.elem_bytes, layout.replicated, needs_id)
        plan = self.cache.moves.get(key)
        if plan is None:
            plan = self.cache.moves[key] = _move_plan(layout, needs, self.latency, self.system)
        if isinstance(plan, _GatherMove):
            done = self._emit("all_gather", plan.devices, plan.chunks, list(ready), plan.total, op_name, mb)
            return {d: done[i] for i, d in enumerate(plan.devices)}
        result: dict[str, list[int]] = {dev: [] for dev in plan.order}
        for dev, hi in plan.local:
            result[dev].extend(ready[hi])
        if plan.any_flow:
            coll = self.b.add_collective(Collective(plan.kind, "direct", plan.devices, plan.total, op_name, 1))
            if plan.flows:
                first = emit_flows(self.b, plan.block, ready, coll, op_name, mb)
                for k, flow in enumerate(plan.flows):
                    result[flow.destination].append(first + k)
        return {d: _unique(v) for d, v in result.items()}


def _move_plan(layout: _Layout, needs, latency, system: System) -> _GatherMove | _DirectMove:
    """How to bring each needed region from ``layout`` to its device, as indices into the
    holders (so one plan serves every lowering with the same layout and needs): a
    :class:`_GatherMove` when a split tensor is needed whole by exactly its holders, else a
    :class:`_DirectMove`."""
    eb = layout.elem_bytes
    full = full_box(layout.shape)
    holders = layout.holders
    holder_devs = tuple(h.device for h in holders)
    need_devs = tuple(d for d, _ in needs)
    # All-gather: a split tensor needed whole by exactly the devices that hold its pieces.
    if (not layout.replicated and len(holders) > 1 and set(need_devs) == set(holder_devs)
            and len(need_devs) == len(holder_devs) and all(box == full for _, box in needs)):
        chunks = [float(box_elems(h.box) * eb) for h in holders]
        return _GatherMove(holder_devs, chunks, float(box_elems(full) * eb))
    order: dict[str, None] = {}
    local: list[tuple[str, int]] = []
    flows: list[_Flow] = []
    for dev, need in needs:
        order.setdefault(dev, None)
        here = next((i for i, h in enumerate(holders) if h.device == dev and intersect(h.box, need) == need), None)
        if here is not None:
            local.append((dev, here))
            continue
        if layout.replicated:
            src = min(range(len(holders)), key=lambda i: (latency(holders[i].device, dev), holder_devs.index(holders[i].device)))
            flows.append((src, dev, float(box_elems(need) * eb)))
            continue
        for i, h in enumerate(holders):
            common = intersect(h.box, need)
            if common is None:
                continue
            if h.device == dev:
                local.append((dev, i))
            else:
                flows.append(_Flow(i, dev, float(box_elems(common) * eb)))
    kind, devices, total = "", (), 0.0
    if flows:
        kind = _classify(holders, needs, full)
        devices = tuple(dict.fromkeys([holders[f.holder].device for f in flows] + [f.destination for f in flows]))
        total = float(sum(f.nbytes for f in flows))
    moved = tuple(f for f in flows if f.nbytes > 0)
    return _DirectMove(tuple(order), tuple(local), moved, kind, devices, total, bool(flows),
                       flow_block(system, holder_devs, moved))


def expand_collective(builder: TaskGraphBuilder, kind: str, algorithm: str, devices: tuple[str, ...], steps,
                      initial: list[tuple[int, ...]], total_bytes: float, *, op: str = "", micro_batch: int = 0,
                      gather: bool = True) -> list[tuple[int, ...]]:
    """Add the transfers of a collective schedule (see :mod:`marssim.collectives.schedules`).

    Rank ``i``'s send of step ``k`` waits for ``initial[i]``, its receives of step ``k-1`` and its
    sends of step ``k-1``. Returns, per rank, the tasks after which its result is ready: with
    ``gather`` (all-gather, all-reduce) every piece it received; otherwise (reduce-scatter) its own
    reduced piece. Zero-byte flows are skipped."""
    coll = builder.add_collective(Collective(kind, algorithm, tuple(devices), float(total_bytes), op, len(steps)))
    block = collective_block(builder.system, devices, steps, gather)
    return emit_collective(builder, block, initial, coll, op, micro_batch)


def _union(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...]:
    """``a`` then the items of ``b`` not in it (first appearance order)."""
    return a + tuple(x for x in b if x not in a) if a != b else a


def _even_micro_batches(graph: Graph, micro_batches: int) -> bool:
    """True when every op's batch dimension splits into ``micro_batches`` equal parts."""
    return all(op.dim(BATCH_DIM[op.kind]) % micro_batches == 0 for op in graph.ops)


def _disjoint_cover(needs, full: Box) -> bool:
    boxes = [b for _, b in needs]
    if sum(box_elems(b) for b in boxes) != box_elems(full):
        return False
    for i in range(len(boxes)):
        for j in range(i + 1, len(boxes)):
            if intersect(boxes[i], boxes[j]) is not None:
                return False
    return True


def _split_axis(box: Box, full: Box) -> int | None:
    for axis in range(4):
        if box[axis] != full[axis]:
            return axis
    return None


def _classify(holders, needs, full: Box) -> str:
    holder_devs = {h.device for h in holders}
    need_devs = {d for d, _ in needs}
    if len(holders) == 1 and len(need_devs) > 1:
        return "broadcast" if len({b for _, b in needs}) == 1 else "scatter"
    if len(need_devs) == 1 and len(holders) > 1:
        return "gather"
    if need_devs <= holder_devs or holder_devs <= need_devs:
        held_axes = {_split_axis(h.box, full) for h in holders}
        need_axes = {_split_axis(b, full) for _, b in needs}
        if held_axes == need_axes:
            return "halo"
        return "all_to_all"
    return "p2p"
