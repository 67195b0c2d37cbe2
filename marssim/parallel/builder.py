"""Build the unit templates of a parallel run (:mod:`.template`): what a Megatron-LM run does in one
unit on one representative GPU, task by task (see :mod:`.lower` for the whole):

* every op of the unit as a kernel of its shard (:class:`.runmodel.RunModel`), after the data it
  reads and the GPU's kernel before it;
* the collectives that convert a tensor's layout between ops as NCCL's ring (or direct) steps
  over the run's routes, the point-to-point transfers of tensors from other pipeline stages;
* the optimizer unit: the data-parallel gradient reduction in buckets, the all-reduces before and
  the kernels of the step;
* the settings that change these tasks, each in its own module (:mod:`.context`,
  :mod:`.userbuffers`, :mod:`.overlap`, :mod:`.experts`), given the builder.

A template refers to the tasks of other units (of this GPU or another representative) by
:data:`.template.Ref`; :class:`Templates` builds each unit's once per run. Units: seconds, bytes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from marssim.collectives.plan import CollectivePlan, ring_steps
from marssim.taskgraph import COMPUTE, TRANSFER, Collective
from marssim.workload import Op, OpKind

from . import context, experts, overlap, userbuffers, zero3
from .host import launch_gaps
from .megatron import grad_scaled, sequence_parallel_params
from .patterns import DP_RING, PULL_PREV, TP_RING, ep_peer
from .runmodel import RunModel
from .template import AFTER_PREVIOUS, COLUMNS, LAST, LAST_BACKWARD, SAME, Ref, Steps, Template, column_array, freeze

__all__ = ["Templates", "UnitBuilder"]

_GROUP_PLAN = object()  # a ring's plan: its group's own (see UnitBuilder.ring)
_ref = tuple.__new__  # a Ref from its fields without NamedTuple's constructor in Python (the builder's hot path)


def _as_mode(refs: tuple, mode: str) -> tuple:
    """``refs`` read as ``mode`` (:meth:`.template.Ref.as_mode`): themselves as :data:`SAME`."""
    return refs if mode == SAME else tuple(r.at_last() for r in refs)


@dataclass
class Templates:
    """The unit templates of one run (``model``), built on first use by :class:`UnitBuilder`, by
    (representative GPU, unit key)."""

    model: RunModel
    built: dict[tuple[int, tuple[int, str]], Template] = field(default_factory=dict)

    def get(self, rep: int, key: tuple[int, str]) -> Template:
        """The template of unit ``key`` (chunk, direction) of representative ``rep``."""
        hit = self.built.get((rep, key))
        if hit is None:
            hit = self.built[(rep, key)] = UnitBuilder(self, rep, key).build()
        return hit


class UnitBuilder:
    """Builds the :class:`~.template.Template` of unit ``key`` (chunk, direction) of representative
    GPU ``rep`` of the run of ``templates``."""

    def __init__(self, templates: Templates, rep: int, key: tuple[int, str]) -> None:
        self.templates = templates
        self.low = low = templates.model
        self.rep = rep
        self.key = key
        self.t = Template()
        self.node_names = low.system.nodes
        self._mine: dict[int, Ref] = {}  # me()'s refs
        self._issued: dict[str, tuple] = {}  # per ring pattern (communicator): its last collective's refs

    # ------------------------------------------------------------------ rows
    def _row(self, kind: int, device: int, duration: float, src: int, dst: int, nbytes: float, route: int,
             flops: float, energy: float, mem_node: int, mem_bytes: float, op: int, coll: int, deps,
             steps: int = 1) -> int:
        t = self.t
        rel = len(t.preds)
        c = t.cols
        c["kind"].append(kind)
        c["device"].append(device)
        c["duration"].append(duration)
        c["src"].append(src)
        c["dst"].append(dst)
        c["nbytes"].append(nbytes)
        c["route"].append(route)
        c["flops"].append(flops)
        c["energy"].append(energy)
        c["mem_node"].append(mem_node)
        c["mem_bytes"].append(mem_bytes)
        c["op"].append(op)
        c["collective"].append(coll)
        c["steps"].append(steps)
        local = []
        me, key = self.rep, self.key
        for ref in dict.fromkeys(deps):
            rep, unit, at, mode = ref
            if rep == me and unit == key and mode == SAME:
                local.append(at)
            else:
                t.ext.append((rel, ref))
        t.preds.append(local)
        return rel

    def _repeat_step(self, first: int, count: int, prv_rep: int) -> int:
        """``count`` more rows like ``first`` (a ring step's transfer), each after the one before
        it here and the same step of ``prv_rep``'s ring rank (the rank that sends to this one):
        :meth:`ring`'s steps, appended at once. Returns the last row."""
        if count <= 0:
            return first
        t = self.t
        c = t.cols
        for col in c.values():
            col.extend([col[first]] * count)
        t.preds.extend(itertools.repeat(AFTER_PREVIOUS, count))
        t.runs.append((first + 1, count))
        # the references to prv_rep's steps, as one entry (expanded by template_edges)
        t.ext.append((first + 1, Steps(count, prv_rep, self.key)))
        return first + count

    def me(self, rel: int) -> Ref:
        """Task ``rel`` of this unit, of the same micro-batch (one object per task: a row reads
        the tasks before it many times)."""
        hit = self._mine.get(rel)
        if hit is None:
            hit = self._mine[rel] = _ref(Ref, (self.rep, self.key, rel, SAME))
        return hit

    def peer_ref(self, rep: int, rel: int) -> Ref:
        """Task ``rel`` of the same unit and micro-batch of representative ``rep``."""
        return _ref(Ref, (rep, self.key, rel, SAME))

    def compute(self, op: Op, deps, timing: tuple[float, float, float, float] | None = None,
                kernels: int | None = None) -> int:
        """A kernel of ``op`` (its shard, or ``timing``: seconds, FLOPs, joules, output bytes of a
        part of it) after ``deps`` and this GPU's kernel before it; ``kernels``: how many it
        launches (default: as many as the shard's)."""
        seconds, flops, energy, out_bytes = timing or self.low.shard(op, self.rep)
        t = self.t
        if t.last_compute >= 0:
            deps = tuple(deps) + (self.me(t.last_compute),)
        rel = self._row(COMPUTE, self.rep, seconds, -1, -1, 0.0, -1, flops, energy,
                        self.rep if out_bytes > 0 else -1, out_bytes, self.low.op_index[op.name], -1, deps)
        t.kernels[rel] = self.low.kernels(op, self.rep) if kernels is None else kernels
        if t.first_compute < 0:
            t.first_compute = rel
        t.last_compute = rel
        return rel

    def kernel_row(self, op: Op, seconds: float, deps, kernels: int = 1) -> int:
        """A compute task of ``seconds`` (``kernels`` kernels) on this GPU labelled ``op``
        (kernels Megatron-LM runs for it that are not the op's own shard), after this unit's
        previous kernel."""
        t = self.t
        if t.last_compute >= 0:
            deps = tuple(deps) + (self.me(t.last_compute),)
        rel = self._row(COMPUTE, self.rep, seconds, -1, -1, 0.0, -1, 0.0, 0.0, -1, 0.0, self.low.op_index[op.name], -1,
                        deps)
        t.kernels[rel] = kernels
        if t.first_compute < 0:
            t.first_compute = rel
        t.prev_compute, t.last_compute = t.last_compute, rel
        return rel

    def flow(self, src: int, dst: int, nbytes: float, op: str, coll: int, deps, hold: bool, steps: int = 1,
             pulled: bool = False, plan: CollectivePlan | None = None, held: float | None = None,
             pattern: str | None = None) -> int:
        """A transfer of ``nbytes`` (in ``steps`` back-to-back steps) from ``src`` to ``dst``;
        ``hold``: the receiver keeps ``held`` bytes (default ``nbytes``) until the transfer's
        readers end; ``pulled``: one such transfer per member of the receiver's class (else of the
        sender's); ``plan``: the collective whose steps these are (their latency and weight on the
        links, else the route's own); ``pattern``: the communication pattern it belongs to (the
        latency it waits, :meth:`Folding.latency`)."""
        low = self.low
        route = low.step_route(src, dst, dst if pulled else None, plan, pattern)
        receiver = low.fold.rep(dst) if dst in low.fold.class_of else dst
        return self._row(TRANSFER, -1, 0.0, src, dst, nbytes, route, 0.0, 0.0, receiver if hold else -1,
                         (nbytes if held is None else held) if hold else 0.0, low.op_index[op], coll, deps, steps)

    # ------------------------------------------------------------------ collectives
    def collective(self, kind: str, group: str, pattern: str, nbytes: float, op: str, steps: int,
                    algorithm: str = "ring") -> int:
        names = self.low.group_names.get((self.rep, pattern))
        if names is None:
            names = self.low.group_names[(self.rep, pattern)] = tuple(self.node_names[g] for g in self.group(pattern))
        coll = Collective(kind, algorithm, names, float(nbytes), op, steps, group)
        self.t.colls.append(coll)
        return len(self.t.colls) - 1

    def group(self, pattern: str) -> list[int]:
        """The GPUs of ``pattern``'s ring from this representative on (memoised per lowering)."""
        return self.ring_from(self.rep, pattern)

    def ring_from(self, start: int, pattern: str) -> list[int]:
        """The GPUs of ``pattern``'s ring from GPU ``start`` on (memoised per lowering)."""
        key = (start, pattern)
        hit = self.low.groups.get(key)
        if hit is not None:
            return hit
        peer = self.low.place.patterns().get(pattern) if pattern else None
        out = [start]
        if peer is not None:
            seen = {start}
            g = peer(start)
            while g not in seen and len(out) < 1 << 16:
                out.append(g)
                seen.add(g)
                g = peer(g)
        self.low.groups[key] = out
        return out

    def ring(self, kind: str, group: str, pattern: str, size: float, n: int, op: str, deps,
             plan: CollectivePlan | None | object = _GROUP_PLAN, max_rows: int = 0) -> tuple:
        """A collective over the ``n`` ranks of ``pattern``'s ring of ``size`` bytes (the whole
        tensor per rank) as NCCL runs it (:meth:`.runmodel.RunModel.plan`): its steps, each rank sending
        the step's bytes to its ring neighbour with the step's latency and weight on the links
        (:func:`marssim.collectives.group.hop_step`); without a plan, ring steps at the links'
        line rate: all-reduce 2(n-1) steps, reduce-scatter and all-gather n-1, each sending size/n.
        ``plan``: the plan to run instead of the group's own (its steps over this ring). The
        collectives of one ring pattern (one NCCL communicator) run one after another in the
        order this unit issues them, as NCCL runs a communicator's operations on its stream.
        ``max_rows``: a ring over several classes of GPUs takes at most this many transfers per
        rank (0: one per step; see below). Returns the refs after which this rank's result is
        ready."""
        if n <= 1 or size <= 0:
            return tuple(deps)
        # a communicator runs its collectives one after another, in the order they are issued
        deps = tuple(dict.fromkeys(tuple(deps) + self._issued.get(pattern, ())))
        low = self.low
        peer = low.place.patterns()[pattern]
        members = self.group(pattern)
        if plan is _GROUP_PLAN:
            plan = low.plan(kind, size, members)
        if plan is None:
            steps, chunk, algorithm = ring_steps(kind, n), size / n, "ring"
        else:
            steps, chunk, algorithm = plan.steps, plan.payload_per_step, plan.algorithm
        nxt = peer(self.rep)
        prv = members[-1] if peer(members[-1]) == self.rep else self.rep  # the ring's rank before this one
        prv_rep = low.fold.rep(prv)
        coll = self.collective(kind, group, pattern, size, op, steps, algorithm)
        if prv_rep == self.rep:
            # the whole ring is this GPU's class: every rank's steps follow each other in lockstep,
            # so the steps are one transfer of `steps` back-to-back steps (exact, see TaskGraph.steps)
            rel = self.flow(self.rep, nxt, chunk * steps, op, coll, tuple(deps), hold=False, steps=steps, plan=plan,
                            pattern=pattern)
            self._issued[pattern] = (self.me(rel),)
            return (self.me(rel),)
        if low.coupled_rings and steps > 1:
            # one transfer of `steps` steps whose k-th step waits for its own (k-1)-th and for the
            # (k-1)-th of prv_rep's same transfer: the steps below as one row (TaskProgram.coupled)
            last = self.flow(self.rep, nxt, chunk * steps, op, coll, tuple(deps), hold=False, steps=steps, plan=plan,
                             pattern=pattern)
            self.t.coupled.append((last, prv_rep, float(chunk)))
        elif max_rows and steps > max_rows:
            # at most max_rows transfers, each of `per` back-to-back steps, each after its own
            # previous one and prv_rep's (the steps coupled per transfer rather than per step:
            # the same times while the ranks run in lockstep)
            per = -(-steps // max_rows)
            rows, rest = divmod(steps, per)
            first = self.flow(self.rep, nxt, chunk * per, op, coll, tuple(deps), hold=False, steps=per, plan=plan,
                              pattern=pattern)
            last = self._repeat_step(first, rows - 1, prv_rep)
            if rest:
                last = self.flow(self.rep, nxt, chunk * rest, op, coll, (self.me(last), self.peer_ref(prv_rep, last)),
                                 hold=False, steps=rest, plan=plan, pattern=pattern)
        else:
            first = self.flow(self.rep, nxt, chunk, op, coll, tuple(deps), hold=False, plan=plan, pattern=pattern)
            last = self._repeat_step(first, steps - 1, prv_rep)
        done = tuple(dict.fromkeys((self.me(last), self.peer_ref(prv_rep, last))))
        self._issued[pattern] = done
        return done

    def all_to_all(self, size: float, op: str, deps) -> tuple:
        """Direct all-to-all over the expert-parallel group: 1/ep of ``size`` to each peer."""
        low = self.low
        ep = low.cfg.ep
        if ep <= 1 or size <= 0:
            return tuple(deps)
        patterns = low.place.patterns()
        coll = self.collective("all_to_all", "ep", ep_peer(1), size, op, 1, "direct")
        ready = []
        for k in range(1, ep):
            peer = patterns[ep_peer(k)]
            rel = self.flow(self.rep, peer(self.rep), size / ep, op, coll, deps, hold=False)
            ready.append(self.me(rel))
            source = patterns[ep_peer(ep - k)](self.rep)  # who sends to this rank in the same step
            ready.append(self.peer_ref(low.fold.rep(source), rel))
        return tuple(dict.fromkeys(ready))

    # ------------------------------------------------------------------ tensors
    def tensor(self, name: str, want: str, op_name: str) -> tuple:
        """Refs to wait for before reading tensor ``name`` in layout ``want`` (adding the
        transfers and collectives that bring it here)."""
        low = self.low
        producer = low.graph.ops[low.op_index[name]]
        if producer.kind == OpKind.INPUT:
            return ()
        t = self.t
        hit = t.converted.get((name, want))
        if hit is not None:
            return hit
        have, refs = self.locate(name)
        kept = self._kept_expert_conversion(name, have, want)
        if kept is not None:
            t.converted[(name, want)] = kept
            return kept
        if have != want and want != "*" and self.low.unit_of.get(name) != self.key and t.prev_compute >= 0:
            # a tensor kept from another unit is converted when the kernel before its reader starts
            # (Megatron-LM launches the all-gather of a saved input as the input-gradient GEMM
            # starts), not as soon as it was produced
            refs = refs + (self.me(t.prev_compute),)
        refs = self.convert(name, have, want, refs, op_name)
        t.converted[(name, want)] = refs
        return refs

    def _kept_expert_conversion(self, name: str, have: str, want: str) -> tuple | None:
        """The refs of an expert-layout conversion (an all-to-all, an expert-tensor-parallel
        gather) that the unit producing ``name`` on this GPU already made to ``want``, or None:
        autograd keeps the converted tensor for the backward (Megatron-LM's token dispatcher
        saves the tokens it received), where a tensor-parallel all-gather of a saved input is run
        again. Another stage's tensor, or a conversion its unit did not make, is not kept."""
        key = self.low.unit_of.get(name)
        if (key is None or key == self.key or have == want or want == "*"
                or have not in experts.EXPERT_LAYOUTS or want not in experts.EXPERT_LAYOUTS
                or self.low.stage_of_chunk(key[0]) != self.low.stage_of_chunk(self.key[0])):
            return None
        hit = self.templates.get(self.rep, key).converted.get((name, want))
        return None if hit is None else _as_mode(hit, SAME)

    def locate(self, name: str) -> tuple[str, tuple]:
        """Where tensor ``name`` is, as (layout, refs): produced in this unit, in another unit of
        this GPU, or on another stage (then a point-to-point transfer brings it here)."""
        low = self.low
        t = self.t
        if name in t.produced:
            return t.produced[name]
        key = low.unit_of[name]
        mode = LAST if self.key[1] == "O" and key[1] != "O" else SAME
        stage = low.stage_of_chunk(key[0])
        here = low.stage_of_chunk(self.key[0])
        if stage == here:
            other = self.templates.get(self.rep, key)
            layout, refs = other.produced[name]
            return layout, _as_mode(refs, mode)
        peer = low.gpu_on_stage(self.rep, stage)
        sender = low.fold.rep(peer)
        other = self.templates.get(sender, key)
        layout, refs = other.produced[name]
        refs = _as_mode(refs, mode)
        nbytes = low.layout_bytes(name, layout)
        tp = low.tp_here(self.rep)
        # Megatron-LM's scatter/gather of pipeline activations (p2p_communication.py, _communicate:
        # scatter_gather_tensors_in_pipeline, not with sequence parallelism): each tensor-parallel
        # rank sends its 1/tp of the tensor, the receivers all-gather it
        split = (low.cfg.scatter_gather and layout == "R" and tp > 1 and self.key[1] != "O"
                 and low.cfg.tp_of(stage) == tp and round(nbytes) % tp == 0)
        sent = nbytes / tp if split else nbytes
        plan = low.plan("send_recv", sent, [peer, self.rep])
        coll = self.collective("p2p", "emb" if self.key[1] == "O" else "pp", "", sent, name, 1,
                                "direct" if plan is None else plan.algorithm)
        rel = self.flow(peer, self.rep, sent, name, coll, refs, hold=True, pulled=True, plan=plan, held=nbytes,
                        pattern=low.pull_pattern(here, stage))
        if other.send_wait >= 0 and self.key[1] != "O":  # a blocking pipeline send: its sender waits for it
            other.ext.append((other.send_wait, self.me(rel)))
        ready = (self.me(rel),)
        if split:
            ready = ready + self.ring("all_gather", "pp", TP_RING, nbytes, tp, name, ready)
        result = (layout, ready + tuple(r for r in refs if r.rep == self.rep))
        t.produced[name] = result
        return result

    def convert(self, name: str, have: str, want: str, refs: tuple, op_name: str) -> tuple:
        low = self.low
        if have == want or want == "*":
            return refs
        tp = low.tp_here(self.rep)
        full = low.layout_bytes(name, "R")
        if have in experts.EXPERT_LAYOUTS and want in experts.EXPERT_LAYOUTS:
            return self._expert_conversion(name, have, want, refs)
        if have == "P" and want in ("R", "S", "F"):
            kind = "reduce_scatter" if want in ("S", "F") else "all_reduce"
            return refs + self.ring(kind, "tp", TP_RING, full, tp, name, refs)
        if have in ("S", "F") and want == "R":
            return refs + self.ring("all_gather", "tp", TP_RING, full, tp, name, refs)
        if have == "S" and want == "F":
            return refs + self.ring("all_gather", "tp", TP_RING, full, tp, name, refs)
        return refs  # R -> S/F/D/E, D/E among themselves without ep, F -> S: local slices

    def _expert_conversion(self, name: str, have: str, want: str, refs: tuple) -> tuple:
        """Routed tokens from one expert layout to another (:func:`.experts.expert_path`): the
        all-to-all over the expert-parallel group (the busiest rank's tokens), the all-gather and
        reduce-scatter over the expert-tensor-parallel group."""
        low = self.low
        stage = low.place.stage(self.rep)
        etp, pattern = low.cfg.etp_of(stage), experts.etp_pattern(low.cfg, stage)
        for step in experts.expert_path(have, want):
            if step == "a2a":
                refs = refs + self.all_to_all(low.layout_bytes(name, "E"), name, refs)
            elif step == "ag":
                refs = refs + self.ring("all_gather", "tp", pattern, low.layout_bytes(name, "X"), etp, name, refs)
            else:
                refs = refs + self.ring("reduce_scatter", "tp", pattern, low.layout_bytes(name, "Z"), etp, name, refs)
        return refs

    # ------------------------------------------------------------------ the unit
    def build(self) -> Template:
        low = self.low
        direction = self.key[1]
        t = self.t
        if direction == "O":
            self._optimizer()
        elif direction == "G":
            overlap.param_gather_unit(self)
        else:
            plan = low.zero3_plans.get(self.key) if low.zero3_plans else None
            starts = {u.first: i for i, u in enumerate(plan.uses)} if plan is not None else {}
            ready: dict[int, tuple] = {}
            if starts:  # the unit's start on its GPU (after the unit before it), where its first gathers issue
                t.first_compute = t.last_compute = self._row(
                    COMPUTE, self.rep, 0.0, -1, -1, 0.0, -1, 0.0, 0.0, -1, 0.0,
                    low.op_index[low.unit_ops[self.key][0].name], -1, ())
            for i, op in enumerate(low.unit_ops.get(self.key, [])):
                if i in starts:
                    self._zero3_use(plan, starts[i], op, ready)
                self.op(op)
        launch = low.launch(self.rep)
        if launch > 0 and t.kernels:  # the host's launch gaps, the unit starting synchronised (.host)
            rows = sorted(t.kernels)
            durations = t.cols["duration"]
            for r, gap in zip(rows, launch_gaps([durations[r] for r in rows], [t.kernels[r] for r in rows], launch)):
                durations[r] += gap
        if overlap.sends_block(low, self.key):  # its sends' end, which the GPU's next kernel waits for
            t.send_wait = self._row(COMPUTE, self.rep, 0.0, -1, -1, 0.0, -1, 0.0, 0.0, -1, 0.0,
                                    low.op_index[low.unit_ops[self.key][-1].name], -1, (self.me(t.last_compute),))
            t.prev_compute, t.last_compute = t.last_compute, t.send_wait
        t.arrays = {name: column_array(t.cols[name], dtype, t.runs) for name, dtype in COLUMNS.items()}
        freeze(t)
        return t

    def op(self, op: Op) -> None:
        low = self.low
        rule = low.rules[op.name]
        refs = userbuffers.pipelined(self, op, rule) if low.cfg.tp_comm_overlap and not rule.alias else None
        if refs is None:
            deps: list = []
            for name, want in zip(op.inputs, rule.want):
                deps.extend(self.tensor(name, want, op.name))
            if self._param_deps:
                deps.extend(self._param_deps)
            deps.extend(overlap.param_gather_deps(self, op))
            if rule.alias:
                self.t.produced[op.name] = (rule.out, tuple(dict.fromkeys(deps)))
                return
            if context.is_ring_core(op, low.cfg.cp):
                refs = context.ring_core(self, op, tuple(deps))
            else:
                refs = (self.me(self.compute(op, deps)),)
        tp = low.tp_here(self.rep)
        if rule.loss_reduce:  # vocabulary-parallel cross-entropy: max, target logit, sum of exponentials
            t = low.t
            refs = refs + self.ring("all_reduce", "tp", TP_RING, 3 * 4.0 * t.batch * t.seq, tp, op.name, refs)
        out = rule.out
        if op.name in low.gather_out:  # read by a stage of another tensor-parallel degree: leaves whole
            refs = refs + self.ring("all_gather", "tp", TP_RING, low.layout_bytes(op.name, "R"), tp, op.name, refs)
            out = "R"
        self.t.produced[op.name] = (out, refs)

    _param_deps: tuple = ()

    def param_deps(self, op: Op) -> tuple:
        """The refs ``op``'s kernel waits for its parameters: ZeRO-3's all-gather of its module,
        the overlapped parameter all-gather's bucket (:func:`.overlap.param_gather_deps`)."""
        return tuple(self._param_deps) + overlap.param_gather_deps(self, op)

    def _zero3_use(self, plan, use: int, op: Op, ready: dict[int, tuple]) -> None:
        """ZeRO-3 at the hook of ``plan``'s use ``use`` (whose first op is ``op``): its own
        all-gather (a fetch) when the kernel before it has ended, then the prefetches it issues
        once its parameters are there, one after another on the data-parallel communicator
        (:mod:`.zero3`); the use's kernels wait for its parameters."""
        low = self.low
        t = self.t
        issue = (self.me(t.last_compute),) if t.last_compute >= 0 else ()
        mine = [k for k, g in enumerate(plan.gathers) if g.issuer == use]
        for k in mine:
            if plan.gathers[k].use == use:
                ready[k] = self.ring("all_gather", "dp", DP_RING, plan.gathers[k].params * low.param_bytes,
                                     low.cfg.dp_cp, op.name, issue, max_rows=zero3.RING_ROWS)
        source = plan.source[use]
        own = ready.get(source, ()) if source >= 0 else ()
        for k in mine:
            if plan.gathers[k].use != use:
                ready[k] = self.ring("all_gather", "dp", DP_RING, plan.gathers[k].params * low.param_bytes,
                                     low.cfg.dp_cp, op.name, issue + own, max_rows=zero3.RING_ROWS)
        self._param_deps = own

    def _optimizer(self) -> None:
        """After the chunk's last backward: its gradients reduced over the data-parallel group in
        buckets, in the gradient buffer's type (:func:`.megatron.grad_dtype`), one bucket after
        another (:meth:`ring`; the chunks of an interleaved schedule each have their own order
        here). On the stage's last
        chunk, the optimizer step of the stage as Megatron-LM's ``optimizer.step`` runs it, after
        ``reduce_model_grads`` (``optimizer/optimizer.py``): the norm and bias gradients of sequence
        parallelism all-reduced over the tensor-parallel group (``allreduce_layernorm_grads``), the
        tied word embedding's gradient all-reduced between the first and last stage
        (``allreduce_word_embedding_grads``), per group the kernels before the global norm, the
        all-reduces over the model-parallel group (fp16's inf/NaN flag, the norm:
        :meth:`_model_parallel_all_reduce`), then per group the Adam step and what follows it;
        ZeRO's parameter all-gather."""
        low = self.low
        cfg = low.cfg
        ops = low.unit_ops.get(self.key, [])
        if not ops:
            return
        gb = low.grad_bytes
        buffers = [op for op in ops if op.param("what") == "grad_buffer"]
        # buckets in the order gradients complete: the chunk's later layers first
        buckets: list[list[Op]] = []
        size = 0
        for buf in sorted(buffers, key=lambda o: -o.param("layer")):
            if not buckets or size >= (cfg.zero3_bucket if cfg.zero == 3 else cfg.bucket):
                buckets.append([])
                size = 0
            buckets[-1].append(buf)
            size += low.opt_params.get(buf.param("layer"), 0)
        kind = "reduce_scatter" if cfg.zero >= 1 else "all_reduce"
        for bucket in buckets:
            deps: list = []
            dense = expert = 0.0
            for buf in bucket:
                for name in buf.inputs:
                    deps.extend(self._gradient(name, buf))
                dense += low.opt_params.get(buf.param("layer"), 0) - low.rank_expert_params.get(buf.param("layer"), 0)
                expert += low.rank_expert_params.get(buf.param("layer"), 0)
            if not cfg.overlap_grad_reduce:
                deps.append(Ref(self.rep, LAST_BACKWARD, 0, LAST))
            name = bucket[0].name
            ready = self.ring(kind, "dp", DP_RING, dense * gb, cfg.dp_cp, name, tuple(deps))
            if expert:  # over the ranks that hold the same expert weights
                pattern, n = experts.gradient_group(cfg, low.place.stage(self.rep))
                ready = ready + self.ring(kind, "dp", pattern, expert * gb, n, name, tuple(deps))
            for buf in bucket:
                self.t.produced[buf.name] = ("R", tuple(dict.fromkeys(ready)))
        chunk = self.key[0]
        stage = low.stage_of_chunk(chunk)
        chunks = [c for c in range(len(low.chunks)) if low.stage_of_chunk(c) == stage and (c, "O") in low.unit_ops]
        if chunk != chunks[-1]:
            return  # the stage's last chunk steps the optimizer for all of them
        stage_ops = [op for c in chunks for op in low.unit_ops[(c, "O")]]
        ready_of: dict[int, tuple] = {}
        for buf in stage_ops:
            if buf.param("what") == "grad_buffer":
                ready_of[buf.param("layer")] = self.tensor(buf.name, "*", buf.name)
        everything = tuple(dict.fromkeys(r for refs in ready_of.values() for r in refs))
        if cfg.sp and low.tp_here(self.rep) > 1:  # the norms' and row-parallel biases' gradients
            blocks = sum(1 for layer in ready_of if 0 <= layer < low.t.layers)
            everything = everything + self.ring("all_reduce", "tp", TP_RING, blocks * sequence_parallel_params(low.t)
                                                * gb, low.tp_here(self.rep), stage_ops[0].name, everything)
        head = low.t.layers
        if low.tied_copy and head in ready_of:  # the last stage's copy of the word embedding
            ready_of[head] = ready_of[head] + self._embedding_all_reduce("embed.tokens.grad", stage_ops[0].name,
                                                                         everything)
        adams = sorted(((op.param("layer"), op) for op in stage_ops if op.param("fn") == "adam"), key=lambda kv: -kv[0])
        before = []
        for layer, adam in adams:
            buf = next(op for op in stage_ops if op.param("what") == "grad_buffer" and op.param("layer") == layer)
            seconds, model, count = low.optimizer_before_norm(adam, self.rep)
            if seconds <= 0:
                continue
            low.cost_models.setdefault(buf.name, model)
            deps = ready_of.get(layer, ()) + (everything if cfg.sp else ())
            before.append(self.me(self.kernel_row(buf, seconds, deps, count)))
        synced = tuple(before)
        if adams and low.training:
            for _ in range((cfg.clip_grad > 0) + grad_scaled(low.t)):  # fp16's inf/NaN flag, then the norm
                synced = self._model_parallel_all_reduce(4.0, adams[0][1].name, synced)
        steps = []
        for layer, adam in adams:
            rel = self.compute(adam, ready_of.get(layer, ()) + synced)
            self.t.produced[adam.name] = ("R", (self.me(rel),))
            steps.append((layer, adam, rel))
        overlap.after_steps(self, steps)

    def _gradient(self, name: str, buf: Op) -> tuple:
        """Refs to wait for before gradient ``name`` joins the buffer ``buf``: the gradient of the
        tied output layer, on the last stage, comes to the first stage's word embedding through
        their all-reduce (:meth:`_embedding_all_reduce`)."""
        low = self.low
        key = low.unit_of.get(name)
        if key is not None and low.tied_copy and low.stage_of_chunk(key[0]) != low.stage_of_chunk(self.key[0]):
            return self._embedding_all_reduce(name, buf.name, ())
        return self.tensor(name, "*", buf.name)

    def _embedding_all_reduce(self, name: str, op: str, deps: tuple) -> tuple:
        """The all-reduce of the word embedding's gradient between the first and the last stage
        (Megatron-LM's embedding group: the two ranks of the same tensor-parallel rank), of the
        vocabulary part one rank holds, in the gradient buffer's type, as this rank receives it:
        after ``name``, produced on the other stage (its gradient), a transfer from that stage's
        GPU timed as the two ranks' all-reduce."""
        low = self.low
        t = self.t
        hit = t.converted.get((name, "all_reduce"))
        if hit is not None:
            return hit
        key = low.unit_of[name]
        peer = low.gpu_on_stage(self.rep, low.stage_of_chunk(key[0]))
        sender = low.fold.rep(peer)
        refs = self.templates.get(sender, key).produced[name][1]
        mode = LAST if key[1] != "O" else SAME
        refs = _as_mode(refs, mode)
        nbytes = low.word_embedding_params * low.grad_bytes
        plan = low.plan("all_reduce", nbytes, [peer, self.rep])
        coll = self.collective("all_reduce", "emb", "", nbytes, op, 2 if plan is None else plan.steps,
                                "ring" if plan is None else plan.algorithm)
        steps = 1 if plan is None else plan.steps
        payload = nbytes if plan is None else plan.payload_per_step * plan.steps
        pattern = low.pull_pattern(low.stage_of_chunk(self.key[0]), low.stage_of_chunk(key[0]))
        rel = self.flow(peer, self.rep, payload, op, coll, refs + tuple(deps), hold=False, steps=steps, pulled=True,
                        plan=plan, pattern=pattern)
        out = (self.me(rel),) + tuple(r for r in refs if r.rep == self.rep) + tuple(deps)
        t.converted[(name, "all_reduce")] = out
        return out

    def _model_parallel_all_reduce(self, nbytes: float, op: str, deps: tuple) -> tuple:
        """An all-reduce of ``nbytes`` over the model-parallel group (every stage's tensor-parallel
        ranks: Megatron-LM's ``get_model_parallel_group``), timed as NCCL's plan of that group and
        run as a wait beside the GPU's stream (a transfer over no link: a few bytes, latency
        alone). Each stage waits for its own ranks only: the barrier of every stage it is in
        Megatron-LM is left out (the first stage ends its backward last in every schedule here, so
        it delays other stages' updates, not the iteration, but by their difference)."""
        low = self.low
        members: list[int] = []
        for g in (self.group(PULL_PREV) if low.cfg.pp > 1 else [self.rep]):
            members.extend(self.ring_from(g, TP_RING))  # each stage's tensor-parallel ring from g
        if len(members) < 2:
            return tuple(deps)
        plan = low.plan("all_reduce", nbytes, members)
        if plan is not None:
            seconds = plan.time
        else:  # a ring at line rate: latency-bound
            names = low.system.nodes
            seconds = 2 * (len(members) - 1) * max(
                low.system.route(names[a], names[b]).latency for a, b in zip(members, members[1:] + members[:1]))
        coll = self.collective("all_reduce", "mp", "", nbytes, op, 1, "ring" if plan is None else plan.algorithm)
        rel = self._row(TRANSFER, -1, 0.0, self.rep, self.rep, nbytes, low.wait_route(self.rep, seconds), 0.0, 0.0,
                        -1, 0.0, low.op_index[op], coll, tuple(deps))
        return (self.me(rel),)
