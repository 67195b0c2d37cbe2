"""Time one unit's ops on one GPU in closed form, as the lowering would run them, for the screen
(:mod:`.analytic`): every kernel of the run's shards (:class:`.runmodel.RunModel`), every layout
conversion's collective as NCCL's plan's steps on the ring's slowest hop, the activations received
from other stages, the overlapped GEMMs and attention rings by their closed forms
(:mod:`.userbuffers`, :mod:`.context`) and the host's launch gaps. Units: seconds, bytes.
"""

from __future__ import annotations

from marssim.collectives.group import ring_time, route_bottleneck
from marssim.workload import OpKind

from . import context, experts, userbuffers
from .fold import binding_route
from .host import launch_gaps
from .patterns import TP_RING, ep_peer
from .runmodel import RunModel

__all__ = ["UnitTimer"]


class UnitTimer:
    """Times units of one stage's representative GPU by the lowering's rules and shards."""

    def __init__(self, low: RunModel, gpu: int) -> None:
        self.low = low
        self.gpu = gpu
        self.patterns = low.place.patterns()
        self.system = low.system
        self._ring_cache: dict[tuple, float] = {}
        self._signature: tuple | None = None

    def route_time(self, src: int, dst: int, nbytes: float) -> float:
        route = self.system.route(self.system.nodes[src], self.system.nodes[dst])
        cap = self.system.resource_capacity
        bw = min((float(cap[r]) for r in route.resources), default=float("inf"))
        return route.latency + (nbytes / bw if nbytes > 0 else 0.0)

    def ring(self, pattern: str, n: int, size: float, kind: str) -> float:
        """Seconds of a collective over ``pattern``'s ring of ``n`` ranks, as the lowering runs it
        (:meth:`.builder.UnitBuilder.ring`): NCCL's plan, its steps at the pace of the slowest hop
        (:func:`marssim.collectives.group.hop_step`); without a plan, ring steps at line rate."""
        if n <= 1 or size <= 0:
            return 0.0
        key = (pattern, n, size, kind)
        hit = self._ring_cache.get(key)
        if hit is None:
            members, profile = self.ring_hops(pattern, n)
            plan = self.low.plan(kind, size, members)
            if plan is None:  # a ring's steps go at the pace of its slowest hop
                hit = ring_time(kind, size, n, profile).seconds
            else:  # one plan's step on each kind of hop: shared by every stage's ring alike
                memo = self.low.memo
                hit = memo.get(("ring steps", plan, profile))
                if hit is None:
                    hit = memo[("ring steps", plan, profile)] = ring_time(kind, size, n, profile, plan).seconds
            self._ring_cache[key] = hit
        return hit

    def ring_hops(self, pattern: str, n: int) -> tuple[list[int], frozenset]:
        """The ``n`` GPUs of ``pattern``'s ring from this one, and its hops' kinds: the set of
        (latency s, bottleneck bytes/s) over its hops (:meth:`.runmodel.RunModel.hop`'s inputs)."""
        key = ("hops", pattern, n)
        hit = self._ring_cache.get(key)
        if hit is None:
            peer = self.patterns[pattern]
            members = [self.gpu]
            while len(members) < n:
                members.append(peer(members[-1]))
            ring = (tuple(members), peer(members[-1]))
            layout = getattr(self.low, "layout", None)
            known = layout.hops.get(ring) if layout is not None else None
            if known is not None:
                hit = self._ring_cache[key] = (members, known)
                return hit
            cap = self.system.resource_capacity
            names = self.system.nodes
            low = self.low
            profile = set()
            for g in members:
                nxt = peer(g)
                route = binding_route(self.system, names[g], names[nxt])
                profile.add((low.fold.latency(g, nxt), route_bottleneck(cap, route.resources)))
            hit = self._ring_cache[key] = (members, frozenset(profile))
            if layout is not None:
                layout.hops[ring] = hit[1]
        return hit

    def signature(self) -> tuple:
        """What the time of a block depends on beyond its ops and its chunk's place: the GPU's
        design, its stage's tensor-parallel degree, the hops of its tensor-parallel ring and the
        routes from the GPUs of the stages before and after it (latency and bottleneck of each)."""
        if self._signature is not None:
            return self._signature
        low = self.low
        tp = low.tp_here(self.gpu)
        cap = self.system.resource_capacity
        hops = ()
        if tp > 1 and TP_RING in self.patterns:
            peer = self.patterns[TP_RING]
            members = [self.gpu]
            while len(members) < tp:
                members.append(peer(members[-1]))
            routes = [self.system.route(self.system.nodes[g], self.system.nodes[peer(g)]) for g in members]
            hops = tuple((r.latency, min((float(cap[x]) for x in r.resources), default=float("inf"))) for r in routes)
        here = low.place.stage(self.gpu)
        sides = []
        for other in ((here - 1) % low.cfg.pp, (here + 1) % low.cfg.pp):  # activations and gradients received
            peer = low.gpu_on_stage(self.gpu, other)
            r = self.system.route(self.system.nodes[peer], self.system.nodes[self.gpu]) if peer != self.gpu else None
            sides.append((r.latency, min((float(cap[x]) for x in r.resources), default=float("inf"))) if r else None)
        self._signature = (low.design(self.gpu).name, tp, hops, tuple(sides))
        return self._signature

    def receive(self, peer: int, nbytes: float, layout: str, producer_tp: int) -> tuple[float, float]:
        """Seconds to receive a tensor of ``nbytes`` (``layout``) from ``peer`` on another stage, as
        the lowering does (:meth:`.builder.UnitBuilder.locate`): the send/receive plan, and with
        Megatron-LM's scatter/gather ``1/tp`` of it and the all-gather after: ``(seconds of the
        send/receive, seconds of the all-gather)``."""
        low = self.low
        tp = low.tp_here(self.gpu)
        split = (low.cfg.scatter_gather and layout == "R" and tp > 1 and producer_tp == tp
                 and round(nbytes) % tp == 0)
        sent = nbytes / tp if split else nbytes
        plan = low.plan("send_recv", sent, [peer, self.gpu])
        seconds = self.route_time(peer, self.gpu, sent) if plan is None else low.hop(peer, self.gpu, plan).time
        return seconds, (self.ring(TP_RING, tp, nbytes, "all_gather") if split else 0.0)

    def step_time(self, pattern: str, n: int, nbytes: float) -> float:
        """Seconds of one step of a ring of ``n`` ranks moving ``nbytes`` per step (its slowest hop)."""
        return self.ring(pattern, n, nbytes * n, "all_gather") / (n - 1) if n > 1 else 0.0

    def overlapped(self, op, rule, have: dict[str, str], seen: set) -> float | None:
        """Seconds of ``op`` with the communication it overlaps (context-parallel ring, userbuffers),
        None where no overlap applies; marks the layouts it leaves."""
        low = self.low
        cfg = low.cfg
        if context.is_ring_core(op, cfg.cp):
            step = low.shard(op, self.gpu)[0]
            kv = context.kv_bytes(low.layout_bytes, op)
            block = self.step_time(context.RING_PATTERN, cfg.cp, kv)
            if op.param("fused") == "bwd":
                return context.backward_ring_end(step, block, self.step_time(context.RING_PATTERN, cfg.cp, 2 * kv),
                                                 cfg.cp)
            return context.forward_ring_end(step, block, cfg.cp)
        tp = low.tp_here(self.gpu)
        if not cfg.tp_comm_overlap or tp <= 1:
            return None
        if userbuffers.gathers_input(op, rule):
            name = op.inputs[0]
            if (name, "R") in seen or have.get(name, low.layouts.get(name)) != "S":
                return None
            seen.add((name, "R"))
            chunk = userbuffers.chunk_timing(low, self.gpu, op, tp)[0]
            return userbuffers.ring_exchange_end(chunk, self.step_time(TP_RING, tp, low.layout_bytes(name, "S")), tp)
        if userbuffers.scatters_output(op, rule):
            n = userbuffers.PIPELINE_SPLITS
            chunk = userbuffers.chunk_timing(low, self.gpu, op, n)[0] * userbuffers.sm_margin(low.design(self.gpu))
            scatter = self.ring(TP_RING, tp, low.layout_bytes(op.name, "R") / n, "reduce_scatter")
            have[op.name] = "S"
            return userbuffers.pipeline_end(chunk, scatter, n)
        return None

    def expert_conversion(self, name: str, have: str, want: str) -> float:
        """Seconds of the collectives between two expert layouts (:func:`.experts.expert_path`)."""
        low = self.low
        cfg = low.cfg
        stage = low.place.stage(self.gpu)
        etp, pattern = cfg.etp_of(stage), experts.etp_pattern(cfg, stage)
        total = 0.0
        for step in experts.expert_path(have, want):
            if step == "a2a" and cfg.ep > 1:
                peer = self.patterns[ep_peer(1)](self.gpu)
                total += self.route_time(self.gpu, peer, low.layout_bytes(name, "E") / cfg.ep) * (cfg.ep - 1)
            elif step == "ag":
                total += self.ring(pattern, etp, low.layout_bytes(name, "X"), "all_gather")
            elif step == "rs":
                total += self.ring(pattern, etp, low.layout_bytes(name, "Z"), "reduce_scatter")
        return total

    def unit(self, ops: list) -> tuple[float, float, float]:
        """Seconds of one pass over ``ops`` on this GPU: kernels and layout conversions; (apart)
        the activations or gradients received from another stage; of those the send/receive
        alone (what a blocking sender waits for).

        The kernels run one after another; the conversions' collectives one after another on
        the communication stream, each before its reader, which waits for it. In the backward
        each starts from its tensor's kernel (a tensor kept from another unit: from the start of
        the kernel before its reader), so the kernels between hide it, as the lowering runs them
        (:meth:`.builder.UnitBuilder.tensor`); in the forward from its reader's turn."""
        low = self.low
        tp = low.tp_here(self.gpu)
        here = low.place.stage(self.gpu)
        have: dict[str, str] = {}
        seen: set[tuple[str, str]] = set()
        clock = comm = last_start = 0.0  # compute stream, communication stream, the last kernel's start
        done: dict[str, float] = {}  # tensor -> when its kernel ended (this pass)
        received = sent = 0.0
        kernels: list[tuple[float, int]] = []

        def collective(seconds: float, ready: float) -> float:
            nonlocal comm
            comm = max(comm, ready) + seconds
            return comm

        for op in ops:
            rule = low.rules[op.name]
            both = self.overlapped(op, rule, have, seen) if not rule.alias else None
            start = clock
            for name, want in zip(op.inputs, rule.want):
                producer = low.graph.ops[low.op_index[name]]
                if producer.kind == OpKind.INPUT or (name, want) in seen:
                    continue
                seen.add((name, want))
                layout = have.get(name, low.layouts[name])
                if name not in have:  # produced in another unit: another stage's output arrives
                    stage = low.stage_of_chunk(low.chunk_of_layer[producer.param("layer")])
                    if stage != here and producer.param("phase", "fwd") != "opt":
                        peer = low.gpu_on_stage(self.gpu, stage)
                        if name in low.gather_out:
                            layout = "R"
                        p2p, gather = self.receive(peer, low.layout_bytes(name, layout), layout, low.cfg.tp_of(stage))
                        received += p2p + gather
                        sent += p2p
                if layout == want or want == "*":
                    continue
                full = low.layout_bytes(name, "R")
                if layout in experts.EXPERT_LAYOUTS and want in experts.EXPERT_LAYOUTS:
                    seconds = self.expert_conversion(name, layout, want)
                elif layout == "P" and want in ("R", "S", "F"):
                    seconds = self.ring(TP_RING, tp, full, "reduce_scatter" if want != "R" else "all_reduce")
                elif layout in ("S", "F") and want == "R" or (layout == "S" and want == "F"):
                    seconds = self.ring(TP_RING, tp, full, "all_gather")
                else:
                    continue
                # Megatron-LM launches the backward's collectives asynchronously (the input
                # gradient's all-reduce beside the weight-gradient GEMM); the forward's wait
                ready = done.get(name, last_start) if op.param("phase", "fwd") == "bwd" else clock
                start = max(start, collective(seconds, ready))
            clock = start
            if rule.alias:
                have[op.name] = rule.out
                done[op.name] = done.get(op.inputs[0], clock) if op.inputs else clock
                continue
            if both is not None:
                last_start, clock = clock, clock + both
                have.setdefault(op.name, rule.out)
                done[op.name] = clock
                continue
            seconds = low.shard(op, self.gpu)[0]
            last_start, clock = clock, clock + seconds
            kernels.append((seconds, low.kernels(op, self.gpu)))
            if rule.loss_reduce:
                clock = collective(self.ring(TP_RING, tp, 12.0 * low.t.batch * low.t.seq, "all_reduce"), clock)
            have[op.name] = rule.out
            if op.name in low.gather_out:
                clock = collective(self.ring(TP_RING, tp, low.layout_bytes(op.name, "R"), "all_gather"), clock)
                have[op.name] = "R"
            done[op.name] = clock
        total = clock
        launch = low.launch(self.gpu)
        if launch > 0 and kernels:  # the host's launch gaps (.host), from a synchronised start
            total += sum(launch_gaps([d for d, _ in kernels], [k for _, k in kernels], launch))
        return total, received, sent
