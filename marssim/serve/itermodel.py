"""The time of one engine iteration of a replica, stage by stage, from the cost model.

An iteration runs one forward pass over a batch of *new tokens*: prefill chunks (``q`` prompt
tokens of a sequence whose context reaches ``ctx`` tokens with them) and decode tokens (one per
sequence, attending over its ``ctx`` cached tokens, its own included). Its ops are the ops of a
``mode=serve`` graph of the same model (:mod:`marssim.workload.llm`), resized to the batch:

* the token-wise ops of a block (norms, the QKV, output and MLP GEMMs, rotary embeddings,
  residual adds) over the batch's ``T`` tokens, held as ``n`` sequences of ``h`` tokens when
  every sequence brings the same number of new tokens (so a batch of equal requests is the very
  op of the ``mode=serve`` graph), else as one row of ``T`` tokens;
* the KV-cache write of the prefill tokens;
* the attention core per group of equal ``(q, ctx)`` prefill chunks (``q`` queries over ``ctx``
  keys; a chunk after the first reads the cache's keys and values, at the cache's type as the
  decode step's ops do), and one batched decode attention over the ``D`` decode sequences (the
  decode step's attention ops, over a cache of ``kv_dtype``) at their mean context
  (rounded; optionally to a multiple of ``context_bucket``): exact when the contexts are equal,
  otherwise the same keys and values read within ``D / 2`` tokens (decode attention streams the
  cache, so its time follows the total);
* the embedding on the first stage; on the last the final norm, the output projection of the
  ``L`` sequences that sample a token, the gather of the vocabulary-parallel logits and the
  sampling.

Each op is split over the stage's tensor-parallel ranks by the lowering's rules
(:func:`marssim.parallel.roles.rule_for`, :func:`marssim.parallel.partition.shard_loops`) and timed by
the cost model on the stage's GPU design, exactly as :func:`marssim.parallel.analytic.serving_times`
times a ``mode=serve`` graph; a layout conversion between ops (the all-reduce after the
row-parallel GEMMs and the embedding, the all-gather of the logits) is a collective over the
stage's GPUs as the parallel lowering runs it: NCCL's plan of the group
(:func:`marssim.collectives.group.group_plan`), its steps at the pace of the slowest hop of the
stage's ring (:func:`marssim.collectives.group.hop_step`); where the collective model does not
describe the group, ring steps at the links' line rate (``steps x (latency + chunk / bandwidth)``
at the slowest hop). So one request alone (or a batch of equal requests) takes the time
``serving_times`` and the estimate of the same ``mode=prefill`` / ``mode=decode`` graph give: the
test suite checks it to 1e-9. (Not where a measured fused MoE operator times a mixture of experts'
experts, below: the graph's estimate and ``serving_times``, which the deployment search screens
with, time their ops one by one.)

A mixture-of-experts block (``moe``) replaces the MLP: the router and its top-k over the batch's
tokens (replicated, token-wise ops as above), then the experts, timed as one piece per batch size
``T`` on the busiest expert-parallel rank (:mod:`marssim.parallel.experts`: experts in order on
the ``ep`` ranks, rank ``r`` receiving the share of the routed tokens its experts' ``expert_load``
adds up to; the all-to-all waits for the busiest, ``busiest_share`` times the uniform tokens).
Two layouts of a replica's ``tp`` GPUs, as the engines run them:

* ``ep = 1``: every GPU holds every expert, each expert's GEMMs split over the ``tp`` GPUs as the
  dense MLP's (column- then row-parallel; vLLM's default), on all ``T`` tokens: each expert
  receives ``ceil(top_k T / experts)`` tokens; the partial sums of the combine are all-reduced
  over the tensor-parallel ring (the dense MLP's all-reduce);
* ``ep = tp``: ``experts / ep`` whole experts per GPU (vLLM's ``--enable-expert-parallel``,
  Megatron-LM's expert parallelism); every GPU dispatches its ``ceil(T / tp)`` tokens' slice to
  the experts' GPUs by an all-to-all, the experts run on the ``ceil(top_k T s / experts)``
  tokens each of the busiest rank's experts receives (``s`` its share), an all-to-all
  returns them, and an all-gather over the tensor-parallel ring makes the hidden state whole
  again. Each all-to-all is one step per peer, one after another, each at its route's latency and
  bottleneck bandwidth (the parallel path's closed form), a rank sending every peer
  ``top_k ceil(T/tp) hidden s / ep`` bytes.

Shared experts (DeepSeekMoE, Qwen-MoE: a dense MLP every token runs beside the routed experts,
``shared.*`` ops) are token-wise ops of the block, split over the ``tp`` GPUs as the dense MLP in
both layouts, their partial sums all-reduced before they are added to the experts' output. A
mixture of experts' first ``dense_layers`` blocks have a dense MLP: the template holds one block
of each kind and a stage's time counts its blocks of each kind (:attr:`IterationModel.stage_blocks`).

When fewer tokens reach the busiest rank than it holds experts (decode at small batches), it
runs only as many experts as tokens, one token each: a fused MoE kernel reads the weights of
the experts that have tokens only (:meth:`IterationModel.expert_work`). Under an FP8 recipe the
casts of the grouped GEMMs' inputs (the dispatched tokens', the activation's) belong to the
experts' piece, sized as the buffers they cast.

An engine that fuses a block's element-wise ops into its other kernels (``fused_elementwise``:
TensorRT-LLM, whose Llama block aiconfigurator-core 0.12.0 models as three element-wise kernels,
``add_norm_1``, ``add_norm_2`` and ``act_gate``, beside the GEMMs and the attention,
``sdk/models/llama.py``) runs a residual add inside the norm after it, an FP8 quantization inside
the kernel that produces its input (norm, activation, attention) and the rotary embeddings inside
the attention kernel: such an *absorbed* op launches no kernel of its own and costs its own
traffic at the GPU's DRAM bandwidth (an upper bound of what it adds to the kernel it joins, which
reads and writes less: the intermediate stays on chip), its layout conversions (the all-reduce
a residual add waits for) unchanged.

What is *not* here: the activations sent between pipeline stages and every other transfer are
flows of the simulation's network (:mod:`.fabric`); this module gives their sizes.

Pieces are memoised by shape (token layout, attention group, logits rows), so a long simulation
costs the cost model once per distinct shape. Units: seconds, bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from marssim.collectives.group import group_plan, ring_time
from marssim.cost.base import CostModel
from marssim.errors import InputError
from marssim.parallel.experts import busiest_share
from marssim.system import System
from marssim.workload import Op, OpKind
from marssim.workload.llm.config import TransformerConfig, with_overrides

__all__ = ["IterationModel", "REF_BATCH", "REF_TOKENS", "stage_layers", "resize_tokens", "attention_loops",
           "ABSORBED_FUNCTIONS", "absorbed_op"]

REF_BATCH = 3
"""Sequences of the template graph the ops are resized from."""
REF_TOKENS = 1009
"""Prompt tokens of the template graph (fewer for a model with a shorter table of learned
positions); any number above 1 works, since only token axes are resized."""


def stage_layers(layers: int, pp: int) -> tuple[int, ...]:
    """Blocks of each pipeline stage: the parallel lowering's balanced split (larger first)."""
    return tuple(layers // pp + (1 if s < layers % pp else 0) for s in range(pp))


def _stage_kinds(blocks: tuple[int, ...], dense_layers: int) -> tuple[tuple[int, int], ...]:
    """Per stage of ``blocks`` consecutive blocks: ``(blocks among the first dense_layers, the
    others)``."""
    out = []
    start = 0
    for n in blocks:
        dense = max(0, min(dense_layers, start + n) - start)
        out.append((dense, n - dense))
        start += n
    return tuple(out)


@dataclass(frozen=True)
class _Piece:
    """The ops of one part of an iteration, in graph order, with their tensor-parallel rules."""

    ops: tuple[tuple[Op, object], ...]


class IterationModel:
    """Seconds of each pipeline stage of a replica for an iteration of a given shape.

    ``config``: the model; ``stages``: per pipeline stage, its GPUs in tensor-parallel rank order
    (every stage the same tensor-parallel degree); ``cost``: the cost model; ``context_bucket``:
    decode attention's mean context rounded to a multiple of this many tokens (1: exact mean);
    ``ep``: expert parallelism of a mixture-of-experts model, 1 or the tensor-parallel degree (see
    the module docstring); ``fused_elementwise``: residual adds, FP8 quantizations and rotary
    embeddings absorbed into the kernels beside them (see the module docstring)."""

    def __init__(self, config: TransformerConfig, system: System, stages: tuple[tuple[str, ...], ...],
                 cost: CostModel, *, context_bucket: int = 1, ep: int = 1, fused_elementwise: bool = False) -> None:
        from marssim.parallel.config import ParallelConfig
        from marssim.parallel.partition import op_rules
        from marssim.workload.llm import build_transformer

        tps = {len(s) for s in stages}
        if len(tps) != 1:
            raise InputError(None, "parallel", "every pipeline stage of a replica needs the same tensor parallelism")
        tp = next(iter(tps))
        if ep != 1 and not config.is_moe:
            raise InputError(None, "ep", "expert parallelism needs a mixture-of-experts model")
        if config.is_moe and ep not in (1, tp):
            raise InputError(None, "ep", f"expected 1 (experts split over tp) or tp={tp} (whole experts over the "
                                         f"tensor-parallel GPUs), got {ep}")
        if config.is_moe and config.experts % ep:
            raise InputError(None, "ep", f"expected a divisor of the {config.experts} experts, got {ep}")
        self.ep = ep if config.is_moe else 1
        self.config = config
        self.system = system
        self.stages = stages
        self.tp = tps.pop()
        self.pp = len(stages)
        self.cost = cost
        self.context_bucket = max(1, int(context_bucket))
        self.fused_elementwise = bool(fused_elementwise)
        self.blocks = stage_layers(config.layers, self.pp)
        if min(self.blocks) < 1:
            raise InputError(None, "parallel", f"pp={self.pp} exceeds the model's {config.layers} layers")
        self.dtype_bytes = {"fp32": 4, "bf16": 2, "fp16": 2, "fp8": 1}[config.dtype]
        ref = REF_TOKENS if config.positions != "learned" else min(REF_TOKENS, config.max_positions - 1)
        if ref < 2:
            raise InputError(None, "model", f"max_positions={config.max_positions} leaves no room to serve a prompt")
        self.ref_tokens = ref
        # a mixture of experts with dense first blocks: a template of one dense block and one with
        # experts; otherwise one block
        mixed = config.is_moe and 0 < config.dense_layers < config.layers
        self.template_layers = 2 if mixed else 1
        dense = 1 if mixed or (config.is_moe and config.dense_layers >= config.layers) else 0
        template = with_overrides(config, mode="serve", prompt=ref, generate=1, batch=REF_BATCH,
                                  layers=self.template_layers, dense_layers=dense if config.is_moe else 0)
        self.main_layer = self.template_layers - 1
        """The template's block of the kind most blocks are (with experts where the model has any)."""
        self.stage_blocks = _stage_kinds(self.blocks, config.dense_layers if mixed else 0)
        """Per stage: ``(dense blocks, blocks of the main kind)``."""
        self.graph = graph = build_transformer(template)
        rules = op_rules(graph, ParallelConfig(tp=self.tp, micro_batch=REF_BATCH))
        self.rules = rules
        embed, block, head, dense_block = [], [], [], []
        for op in graph.ops:
            if op.kind == OpKind.INPUT or not op.name.startswith("prefill."):
                continue
            layer = op.param("layer")
            if layer < 0:
                embed.append((op, rules[op.name]))
            elif layer == self.main_layer:
                block.append((op, rules[op.name]))
            elif layer < self.main_layer:
                dense_block.append((op, rules[op.name]))
            else:
                head.append((op, rules[op.name]))
        self._embed = _Piece(tuple(embed))
        expert = _expert_op if config.is_moe else (lambda op: False)
        self._tokens = _Piece(tuple((op, r) for op, r in block if not op.param("core") and
                                    op.param("what") != "kv_write" and not expert(op)))
        self._dense_tokens = _Piece(tuple((op, r) for op, r in dense_block if not op.param("core") and
                                          op.param("what") != "kv_write"))
        self._experts = _Piece(tuple((op, r) for op, r in block if expert(op)))
        self.expert_share = busiest_share(config.expert_load, self.ep) if config.is_moe else 1
        self._kv_write = _Piece(tuple((op, r) for op, r in block if op.param("what") == "kv_write"))
        self._attention = _Piece(tuple((op, r) for op, r in block if op.param("core")))
        self._head = _Piece(tuple(head))
        # the attention ops' tensor-parallel splits (heads only: they never cut the resized loops)
        self._attention_split = self._splits(self._attention.ops)
        # queries over a cache (decode, later prefill chunks) read its keys and values at the cache's
        # type: the decode step's attention ops, which carry it, op for op those of the prefill
        cached = tuple((op, rules[op.name]) for op in graph.ops
                       if op.name.startswith("decode.1.") and op.param("layer") == 0 and op.param("core"))
        same = len(cached) == len(self._attention.ops) and all(
            a.kind == b.kind for (a, _), (b, _) in zip(cached, self._attention.ops))
        self._cache_attention_split = self._splits(cached) if same else self._attention_split
        self.embed_out = embed[-1][0].name
        self.block_out = block[-1][0].name
        self._layouts = {op.name: r.out for op, r in embed + dense_block + block + head}
        self._layouts.update({op.name: "R" for op in graph.ops if op.kind == OpKind.INPUT})
        sample = next(op for op, _ in head if op.param("what") == "sample")
        self.sample_bytes_per_row = sample.output_bytes / REF_BATCH
        self.hidden_bytes_per_token = config.hidden * self.dtype_bytes
        self.absorbed = frozenset(op.name for op, _ in self._tokens.ops + self._dense_tokens.ops + self._experts.ops
                                  if self.fused_elementwise and absorbed_op(op))
        """Names of the token-wise ops an engine with ``fused_elementwise`` runs inside other kernels."""
        # per stage: the design of its GPUs and its ring's hops (latency, bottleneck bandwidth)
        self._designs = []
        self._dram = []
        self._rings = []
        cap = system.resource_capacity
        for gpus in stages:
            acc = system.accelerator(gpus[0])
            self._designs.append(system.design(gpus[0], acc.designs[0]))
            self._dram.append(float(acc.memory.bandwidth))
            hops = []
            for i, g in enumerate(gpus):
                route = system.route(g, gpus[(i + 1) % len(gpus)])
                bw = min((float(cap[r]) for r in route.resources), default=math.inf)
                hops.append((route.latency, bw))
            self._rings.append(tuple(hops))
        # stages alike (same design and ring) share their memo
        self._stage_class = []
        classes: dict[tuple, int] = {}
        for design, ring in zip(self._designs, self._rings):
            self._stage_class.append(classes.setdefault((design.name, ring), len(classes)))
        self._memo: list[dict] = [{} for _ in classes]
        self._collectives: dict[tuple, tuple[float, float, float]] = {}
        self._check_pieces()
        self.expert_curves = tuple(self._expert_curve(d) for d in self._designs)
        """Per stage: the measured fused MoE operator that times its experts
        (:mod:`marssim.cost.moe_kernels`), or None (the experts' ops one by one)."""

    # ------------------------------------------------------------------ what the model times
    @property
    def token_ops(self) -> tuple:
        """``(op, rule)`` of a block's token-wise ops (views included), template-sized."""
        return self._tokens.ops

    @property
    def dense_token_ops(self) -> tuple:
        """``(op, rule)`` of a dense first block's token-wise ops (a mixture of experts with
        ``dense_layers``; else empty), template-sized."""
        return self._dense_tokens.ops

    @property
    def kv_write_ops(self) -> tuple:
        """``(op, rule)`` of a block's KV-cache write, template-sized."""
        return self._kv_write.ops

    @staticmethod
    def _splits(ops) -> list:
        """``(op, rule, tensor-parallel split)`` of attention ops ``(op, rule)``; InputError for a
        split of a token axis."""
        out = []
        for op, rule in ops:
            split = tuple((d, num, den) for d, num, den in rule.split if op.has_dim(d) and (num != 1 or den != 1))
            if any(d in ("B", "M", "N", "K", "L") and d in attention_loops(op, 1, 1, 1) for d, _, _ in split):
                raise InputError(None, "model", f"{op.name}: a tensor-parallel split of a token axis")
            out.append((op, rule, split))
        return out

    @property
    def attention_ops(self) -> tuple:
        """``(op, rule, tensor-parallel split)`` of a block's attention core, template-sized."""
        return tuple(self._attention_split)

    def design(self, stage: int):
        """The GPU design of ``stage``."""
        return self._designs[stage]

    def kernels(self, stage: int, prefill: bool) -> int:
        """Kernels ``stage`` launches in an iteration (views launch none): per block its token-wise
        ops, attention core and experts (the KV-cache write too when the iteration has prefill
        tokens), and two all-reduces with tensor parallelism; the embedding on the first stage,
        the head on the last."""
        def count(piece: _Piece) -> int:
            return sum(1 for op, rule in piece.ops if not rule.alias and op.name not in self.absorbed)

        per = count(self._attention) + (count(self._kv_write) if prefill else 0) + (2 if self.tp > 1 else 0)
        dense, main = self.stage_blocks[stage]
        total = main * (per + count(self._tokens) + count(self._experts)) + dense * (per + count(self._dense_tokens))
        if stage == 0:
            total += count(self._embed)
        if stage == self.pp - 1:
            total += count(self._head)
        return total

    # ------------------------------------------------------------------ the shape of a batch
    def stage_times(self, tokens: tuple[int, int], prefill_tokens: tuple[int, int],
                    prefill_groups: tuple[tuple[int, int, int], ...], decodes: int, decode_context: int,
                    logits: int) -> tuple[float, ...]:
        """Seconds of each stage for one iteration, its tensor-parallel collectives included.

        ``tokens``: ``(n, h)``, the batch's new tokens as ``n`` sequences of ``h`` (see the
        module docstring); ``prefill_tokens``: the prefill tokens written to the KV cache, as
        ``(n, h)`` likewise (``(0, 0)``: none); ``prefill_groups``: ``(count, q, ctx)`` per group
        of equal prefill chunks; ``decodes``: decode sequences; ``decode_context``: their total
        context (tokens); ``logits``: sequences that sample a token."""
        return tuple(self._stage(s, tokens, prefill_tokens, prefill_groups, decodes, decode_context, logits)[0]
                     for s in range(self.pp))

    def stage_parts(self, tokens: tuple[int, int], prefill_tokens: tuple[int, int],
                    prefill_groups: tuple[tuple[int, int, int], ...], decodes: int, decode_context: int,
                    logits: int) -> tuple[tuple[float, float, int], ...]:
        """Per stage: ``(seconds without the tensor-parallel collectives, bytes each rank sends
        its ring neighbour in them, seconds of their steps' latencies)`` (arguments as
        :meth:`stage_times`). On a ring of equal hops of bandwidth ``b``, the collectives take
        ``latency + bytes / b``: the bytes are those of NCCL's steps weighted by
        :func:`~marssim.collectives.group.hop_step`'s factor, so that at the hop's bandwidth they
        take the plan's time beyond its latencies."""
        if self.ep > 1:
            raise InputError(None, "tp_comm", "tp_comm=network times ring collectives as flows; the experts' "
                                              "all-to-all (ep > 1) is timed closed only: use tp_comm=closed")
        out = []
        for s in range(self.pp):
            total, comm, nbytes, latency = self._stage(s, tokens, prefill_tokens, prefill_groups, decodes,
                                                       decode_context, logits)
            out.append((total - comm, nbytes, latency))
        return tuple(out)

    def ring_hops(self, stage: int) -> tuple[tuple[float, float], ...]:
        """``(latency s, bandwidth bytes/s)`` of each hop of ``stage``'s tensor-parallel ring."""
        return self._rings[stage]

    def _stage(self, s: int, tokens, prefill_tokens, prefill_groups, decodes, decode_context, logits) -> tuple:
        """``(seconds, of them in collectives, collective bytes per rank, seconds of the collectives'
        step latencies)`` of stage ``s``."""
        memo = self._memo[self._stage_class[s]]
        cached = self._cached
        parts = [cached(memo, ("t", tokens), s, self._tokens_time, tokens)]
        if self._experts.ops:
            count = tokens[0] * tokens[1]
            parts.append(cached(memo, ("x", count), s, self._experts_time, count))
        if prefill_tokens[0]:
            parts.append(cached(memo, ("k", prefill_tokens), s, self._kv_time, prefill_tokens))
        for count, q, ctx in prefill_groups:
            parts.append(cached(memo, ("a", count, q, ctx), s, self._attention_time, count, q, ctx))
        if decodes:
            ctx = self.decode_context(decodes, decode_context)
            hit = memo.get(("a", decodes, 1, ctx))
            if hit is None:
                self._decode_attention_window(memo, s, decodes, ctx)
                hit = memo[("a", decodes, 1, ctx)]
            parts.append(hit)
        if len(parts) == 1:
            block = parts[0]
        else:
            block = (sum(p[0] for p in parts), sum(p[1] for p in parts), sum(p[2] for p in parts),
                     sum(p[3] for p in parts))
        dense, n = self.stage_blocks[s]
        total, comm, nbytes, latency = n * block[0], n * block[1], n * block[2], n * block[3]
        if dense:  # dense first blocks: their MLP's token-wise piece instead of the experts'
            common = parts[2:] if self._experts.ops else parts[1:]  # the KV write and the attention
            alike = [cached(memo, ("d", tokens), s, self._dense_tokens_time, tokens)] + common
            total += dense * sum(p[0] for p in alike)
            comm += dense * sum(p[1] for p in alike)
            nbytes += dense * sum(p[2] for p in alike)
            latency += dense * sum(p[3] for p in alike)
        ends = []
        if s == 0:
            ends.append(cached(memo, ("e", tokens), s, self._embed_time, tokens))
        if s == self.pp - 1:
            ends.append(cached(memo, ("h", tokens, logits), s, self._head_time, tokens, logits))
        for e in ends:
            total += e[0]
            comm += e[1]
            nbytes += e[2]
            latency += e[3]
        return total, comm, nbytes, latency

    def decode_context(self, decodes: int, total_context: int) -> int:
        """The context decode attention is timed at: the mean, rounded half up, to a multiple of
        ``context_bucket`` when it is above 1."""
        mean = (2 * total_context + decodes) // (2 * decodes)
        b = self.context_bucket
        if b > 1:
            mean = max(b, (mean + b // 2) // b * b)
        return max(1, mean)

    def activation_bytes(self, tokens: int) -> float:
        """Bytes one tensor-parallel rank sends to the next stage for ``tokens`` tokens (the
        replicated hidden state)."""
        return float(tokens * self.hidden_bytes_per_token)

    def token_bytes(self, rows: int) -> float:
        """Bytes of the sampled tokens of ``rows`` sequences (last stage -> first stage)."""
        return float(rows * self.sample_bytes_per_row)

    # ------------------------------------------------------------------ pieces
    @staticmethod
    def _cached(memo: dict, key: tuple, stage: int, fn, *args) -> tuple:
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = fn(stage, *args)
        return hit

    # every piece: (seconds, of them in collectives, collective bytes per rank, seconds of step latencies)
    def _tokens_time(self, stage: int, tokens: tuple[int, int]) -> tuple:
        n, h = tokens
        # a measured fused MoE operator routes its tokens itself (its top-k inside): the router's
        # top-k op is not charged twice
        fused = self.expert_curves[stage] is not None
        return self._walk(stage, [(resize_tokens(op, n, h, self.ref_tokens), r) for op, r in self._tokens.ops
                                  if not (fused and op.name.endswith(".moe.topk"))])

    def _dense_tokens_time(self, stage: int, tokens: tuple[int, int]) -> tuple:
        n, h = tokens
        return self._walk(stage, [(resize_tokens(op, n, h, self.ref_tokens), r) for op, r in self._dense_tokens.ops])

    def _kv_time(self, stage: int, tokens: tuple[int, int]) -> tuple:
        n, h = tokens
        return self._walk(stage, [(resize_tokens(op, n, h, self.ref_tokens), r) for op, r in self._kv_write.ops])

    def _attention_time(self, stage: int, count: int, q: int, ctx: int) -> tuple:
        # the attention ops read and write only the heads' layout (F): no conversion between
        # them or around them (checked by _check_pieces), so each is its shard's time
        design = self._designs[stage]
        total = 0.0
        for op, rule, split in (self._cache_attention_split if q < ctx else self._attention_split):
            loops = op.loop_dict
            loops.update(attention_loops(op, count, q, ctx))
            for dim, num, den in split:
                loops[dim] = max(1, -(-loops[dim] * num // den))
            seconds = self.cost.op_cost(op.with_loops(**loops), design).time
            total += float(seconds / rule.scale) if rule.scale > 1 else float(seconds)
        return total, 0.0, 0.0, 0

    DECODE_WINDOW = 16
    """Decode attention is timed for this many contexts at once (those of a window aligned to
    it, in steps of ``context_bucket``): a decode batch's mean context grows by about one token
    per iteration, so the next iterations find their time computed, by one vectorised call of
    the cost model instead of one call per op and iteration."""

    def _decode_attention_window(self, memo: dict, stage: int, count: int, ctx: int) -> None:
        """Keep in ``memo`` the decode attention pieces of ``count`` sequences at every context
        of the window holding ``ctx``: the same floats as :meth:`_attention_time` gives each
        (the cost model's ``op_times`` equals its ``op_cost`` bit for bit)."""
        op_times = getattr(self.cost, "op_times", None)
        if op_times is None:  # a cost model without the vectorised path
            memo[("a", count, 1, ctx)] = self._attention_time(stage, count, 1, ctx)
            return
        step = max(1, self.context_bucket)
        first = ctx // (step * self.DECODE_WINDOW) * (step * self.DECODE_WINDOW)
        contexts = [c for c in range(max(step, first), first + step * self.DECODE_WINDOW, step)
                    if ("a", count, 1, c) not in memo]
        if ctx not in contexts:
            contexts.append(ctx)
        design = self._designs[stage]
        ops, pieces = [], []
        for c in contexts:
            splits = self._cache_attention_split if 1 < c else self._attention_split
            pieces.append((c, splits, len(ops)))
            for op, _, split in splits:
                loops = op.loop_dict
                loops.update(attention_loops(op, count, 1, c))
                for dim, num, den in split:
                    loops[dim] = max(1, -(-loops[dim] * num // den))
                ops.append(op.with_loops(**loops))
        seconds = op_times(ops, [design] * len(ops)).tolist()
        for c, splits, at in pieces:
            total = 0.0
            for (_, rule, _), t in zip(splits, seconds[at:at + len(splits)]):
                total += float(t / rule.scale) if rule.scale > 1 else float(t)
            memo[("a", count, 1, c)] = (total, 0.0, 0.0, 0)

    def expert_work(self, count: int) -> tuple[int, int]:
        """``(experts, tokens each)`` the busiest expert-parallel rank runs in an iteration of
        ``count`` new tokens: its ``R`` routed tokens (see the module docstring) over its
        ``experts / ep`` experts, or over ``ceil(R)`` of them when fewer tokens than experts
        reach it (a fused MoE kernel reads only the weights of experts with tokens; the tokens
        taken to hit distinct experts, the most weights they can read)."""
        t = self.config
        at_rank = t.top_k * count * self.expert_share / self.ep
        local = t.experts // self.ep
        active = max(1, min(local, math.ceil(at_rank)))
        return active, max(1, math.ceil(at_rank / active))

    def expert_tokens(self, count: int) -> int:
        """Tokens each expert the busiest rank runs processes (:meth:`expert_work`)."""
        return self.expert_work(count)[1]

    @property
    def experts_timing(self) -> str:
        """What times a mixture of experts' experts on the first stage (its measured fused
        operator, or the ops one by one); empty for a dense model."""
        if not self.config.is_moe:
            return ""
        curve = self.expert_curves[0]
        if curve is None:
            return "the experts' ops one by one (no measured fused MoE operator of this layer, split and routing)"
        s = curve.shape
        return (f"the measured fused MoE operator ({curve.source}, {s.device}, {s.dtype}, tp {s.moe_tp} x ep "
                f"{s.moe_ep}, {len(curve.tokens)} token counts from {curve.tokens[0]:,} to {curve.tokens[-1]:,})")

    def _expert_curve(self, design):
        """The measured fused MoE operator of this model's experts on ``design``, split as this
        replica splits them, under uniform routing; None where the design's stacks measured none
        (or the routing is skewed, or the experts are not gated)."""
        from marssim.cost.model import design_stacks
        from marssim.cost.moe_kernels import moe_curve

        t = self.config
        names = {op.name.split(".")[-1] for op, _ in self._experts.ops}
        uniform = not t.expert_load or len(set(t.expert_load)) == 1
        if not t.is_moe or not uniform or not {"gate", "up"} <= names or design.gpu is None:
            return None
        gate = next(op for op, _ in self._experts.ops if op.name.split(".")[-1] == "gate")
        return moe_curve(design.gpu.calibration, design_stacks(design), gate.math_dtype, t.hidden, t.expert_ffn_size,
                         t.top_k, t.experts, self.tp // self.ep, self.ep)

    def _expert_ops_seconds(self, stage: int, count: int) -> float:
        """Seconds of the experts' ops one by one (dispatch, grouped GEMMs, activation, casts,
        combine) on the busiest rank for ``count`` new tokens, without their collectives."""
        from dataclasses import replace

        t = self.config
        design = self._designs[stage]
        local, m = self.expert_work(count)
        etp = self.tp // self.ep
        h = t.hidden
        total = 0.0
        for op, _ in self._experts.ops:
            loops = op.loop_dict
            if op.kind == OpKind.GEMM:
                sizes = {"B": local, "M": m}
                cut = "N" if op.name.split(".")[-1] in ("gate", "up", "fc1") else "K"  # column / row parallel
                sizes[cut] = -(-loops[cut] // etp)
                part = op.with_loops(**sizes)
            elif op.kind == OpKind.ELTWISE:
                # the activation and its FP8 cast hold the intermediate width, split as the column-
                # parallel GEMMs before them; the dispatched tokens' cast holds the whole hidden width
                whole = op.name.split(".")[-2] == "dispatch"
                part = op.with_loops(N=local, C=loops["C"] if whole else -(-loops["C"] // etp), H=m)
                if op.name in self.absorbed:  # an FP8 cast inside the kernel that produces its input
                    total += part.bytes_moved / self._dram[stage]
                    continue
            else:  # the dispatch into the experts' buffers, the weighted combine out of them
                home = count if self.ep == 1 else -(-count // self.tp)  # the tokens a GPU dispatches
                tokens = (1, h, home, 1)
                routing = (1, t.experts, home, 1)
                buffers = (local, h, m, 1)
                if op.param("what") == "dispatch":
                    new = {"N": local, "C": h, "H": m}
                    part = replace(op, in_shapes=(tokens, routing), out_shape=buffers)
                else:
                    new = {"N": 1, "C": h, "H": home}
                    part = replace(op, in_shapes=(buffers, routing), out_shape=tokens)
                part = replace(part, loops=tuple((k, new.get(k, v)) for k, v in op.loops))
            total += float(self.cost.op_cost(part, design).time)
        return total

    def _experts_time(self, stage: int, count: int) -> tuple:
        """The experts of one block for ``count`` new tokens on the busiest rank (the measured
        fused operator where :attr:`expert_curves` has one, else their ops one by one), with the
        all-reduce (``ep = 1``) or the two all-to-alls and the all-gather (``ep = tp``).

        The measured operator is asked for all ``count`` tokens, as AIConfigurator's own model of
        TensorRT-LLM asks it (every GPU holds the iteration's tokens after tensor-parallel
        attention and routes them to its experts; with ``ep = tp`` marssim's dispatch sends each
        GPU's ``1/tp`` slice instead, the all-to-all timed as above): the same expert work, the
        permute of ``count`` tokens rather than ``count / tp``."""
        t = self.config
        h = t.hidden
        curve = self.expert_curves[stage]
        total = curve(count) if curve is not None else self._expert_ops_seconds(stage, count)
        hidden = float(count * h * self.dtype_bytes)
        if self.tp == 1:
            return total, 0.0, 0.0, 0.0
        if self.ep == 1:
            t_ar, b_ar, k_ar = self._ring(stage, hidden, "all_reduce")
            return total + t_ar, t_ar, b_ar, k_ar
        per_peer = t.top_k * -(-count // self.tp) * h * self.dtype_bytes * float(self.expert_share) / self.ep
        gpus = self.stages[stage]
        cap = self.system.resource_capacity
        a2a = 0.0
        for peer in gpus[1:]:
            route = self.system.route(gpus[0], peer)
            bw = min((float(cap[r]) for r in route.resources), default=math.inf)
            a2a += route.latency + per_peer / bw
        t_ag, b_ag, k_ag = self._ring(stage, hidden, "all_gather")
        comm = 2 * a2a + t_ag
        return total + comm, comm, b_ag, k_ag

    def _embed_time(self, stage: int, tokens: tuple[int, int]) -> tuple:
        n, h = tokens
        ops = [(resize_tokens(op, n, h, self.ref_tokens), r) for op, r in self._embed.ops]
        total, comm, nbytes, latency = self._walk(stage, ops)
        # the first block reads the embedding replicated: the all-reduce of its partial sums
        last = ops[-1][0]
        t, b, k = self._convert(stage, self._layouts[last.name], "R", float(last.output_bytes))
        return total + t, comm + t, nbytes + b, latency + k

    def _head_time(self, stage: int, tokens: tuple[int, int], logits: int) -> tuple:
        n, h = tokens
        ops = []
        for op, r in self._head.ops:
            if op.kind == OpKind.NORM:
                ops.append((resize_tokens(op, n, h, self.ref_tokens), r))
            elif op.param("view"):
                ops.append((resize_tokens(op, n, 1, self.ref_tokens), r))
            else:  # the output projection and the sampling: one row per sequence that samples
                ops.append((resize_tokens(op, logits, 1, self.ref_tokens), r))
        return self._walk(stage, ops)

    def _walk(self, stage: int, ops: list[tuple[Op, object]]) -> tuple:
        """Seconds of ``ops`` on the stage's representative GPU: every op's shard and every layout
        conversion between them (the loop of ``analytic._Timer.unit``); and of them the
        conversions' seconds, bytes per rank and seconds of step latencies."""
        shards = iter(self._shards([(op, rule) for op, rule in ops if not rule.alias], stage))
        have: dict[str, tuple[str, float]] = {}
        seen: set[tuple[str, str]] = set()
        total = comm = nbytes = latency = 0.0
        for op, rule in ops:
            for name, want in zip(op.inputs, rule.want):
                got = have.get(name)
                if got is None or (name, want) in seen:
                    continue  # a graph input, or produced by another piece (checked to need no conversion)
                seen.add((name, want))
                layout, full = got
                if layout != want and want != "*":
                    t, b, k = self._convert(stage, layout, want, full)
                    total += t
                    comm += t
                    nbytes += b
                    latency += k
            if rule.alias:
                have[op.name] = (rule.out, float(op.output_bytes))
                continue
            total += next(shards)
            have[op.name] = (rule.out, float(op.output_bytes))
        return total, comm, nbytes, latency

    def _shards(self, ops: list[tuple[Op, object]], stage: int) -> list[float]:
        """Seconds of each op's shard on ``stage``'s design (its rule's share of the time), in one
        vectorised call of the cost model where it has one (``op_times`` equals ``op_cost`` bit
        for bit); an absorbed op (:attr:`absorbed`) its shard's traffic at the DRAM bandwidth."""
        from marssim.parallel.partition import shard_loops

        design = self._designs[stage]
        parts = []
        for op, rule in ops:
            sizes = shard_loops(op, rule, {}, 1)
            parts.append(op.with_loops(**sizes) if sizes else op)
        timed = [part for part, (op, _) in zip(parts, ops) if op.name not in self.absorbed]
        op_times = getattr(self.cost, "op_times", None)
        if op_times is not None and timed:
            seconds = iter(op_times(timed, [design] * len(timed)).tolist())
        else:
            seconds = iter([self.cost.op_cost(part, design).time for part in timed])
        out = []
        for part, (op, rule) in zip(parts, ops):
            t = part.bytes_moved / self._dram[stage] if op.name in self.absorbed else next(seconds)
            out.append(float(t / rule.scale) if rule.scale > 1 else float(t))
        return out

    def _convert(self, stage: int, have: str, want: str, full: float) -> tuple[float, float, float]:
        """A layout conversion of a tensor of ``full`` bytes over the stage's tensor-parallel
        ranks: ``(seconds, bytes each rank sends, seconds of step latencies)`` (:meth:`_ring`)."""
        if have == want or want == "*":
            return 0.0, 0.0, 0.0
        if have == "P" and want in ("R", "S", "F"):
            return self._ring(stage, full, "all_reduce" if want == "R" else "reduce_scatter")
        if have in ("S", "F") and want == "R" or (have == "S" and want == "F"):
            return self._ring(stage, full, "all_gather")
        return 0.0, 0.0, 0.0

    def _ring(self, stage: int, size: float, kind: str) -> tuple[float, float, float]:
        """Collective ``kind`` of a ``size``-byte tensor (nccl-tests' size) over the stage's
        tensor-parallel ranks, as the parallel lowering runs it: NCCL's plan of the group, its
        steps at the pace of the ring's slowest hop; without a plan, ring steps at the links' line
        rate. ``(seconds, bytes each rank sends (weighted as the step's flows weigh on the links),
        seconds of the steps' latencies)``."""
        n = self.tp
        if n <= 1 or size <= 0:
            return 0.0, 0.0, 0.0
        key = (stage, kind, float(size))
        hit = self._collectives.get(key)
        if hit is not None:
            return hit
        ring = ring_time(kind, size, n, self._rings[stage], group_plan(self.system, self.stages[stage], kind, size))
        hit = (ring.seconds, ring.nbytes, ring.latency)
        self._collectives[key] = hit
        return hit

    def _check_pieces(self) -> None:
        """The pieces are timed apart: check on the template that no tensor crosses from one
        piece to another in a layout its reader must convert (apart from the embedding, whose
        conversion the embedding piece pays)."""
        where = {}
        pieces = (self._embed, self._tokens, self._kv_write, self._attention, self._head, self._experts,
                  self._dense_tokens)
        for piece in pieces:
            for op, _ in piece.ops:
                where[op.name] = id(piece)
        for piece in (self._tokens, self._kv_write, self._attention, self._head, self._dense_tokens):
            for op, rule in piece.ops:
                for name, want in zip(op.inputs, rule.want):
                    if name in where and where[name] != id(piece) and name != self.embed_out:
                        if self._layouts[name] != want and want != "*":
                            raise InputError(None, "model", f"{op.name} reads {name} in layout {want}, produced "
                                                            f"as {self._layouts[name]}: not a serving layout")


_EXPERT_OPS = ("dispatch", "gate", "up", "fc1", "act", "down", "fc2", "combine")
_CAST_SUFFIXES = ("fp8", "fp4", "amax")
"""Name suffixes of a low-precision recipe's ops on a GEMM input: its cast, and under current
scaling or NVFP4 the amax taken before it (:mod:`marssim.workload.llm.precision`)."""

ABSORBED_FUNCTIONS = ("add", "quantize", "rope")
"""Element-wise functions an engine that fuses them runs inside other kernels: a residual add in
the norm after it, an FP8 quantization in the kernel that produces its input, rotary embeddings in
the attention kernel."""


def absorbed_op(op: Op) -> bool:
    """Whether ``op`` (a block's token-wise op) is one that ``fused_elementwise`` absorbs: an
    element-wise op of a function in :data:`ABSORBED_FUNCTIONS`."""
    return op.kind == OpKind.ELTWISE and op.param("fn") in ABSORBED_FUNCTIONS


def _expert_op(op: Op) -> bool:
    """Whether ``op`` (of a block) is one of the experts' piece: the dispatch, the grouped GEMMs
    and their activation, the combine, and under a low-precision recipe the casts of the experts'
    GEMM inputs (``moe.dispatch.fp8``, ``moe.act.fp8``; NVFP4's ``.fp4`` and the ``.amax`` before
    each); the router and its top-k are token-wise."""
    parts = op.name.split(".")
    if parts[-1] in _CAST_SUFFIXES and op.param("fn") in ("quantize", "amax"):
        parts = parts[:-1]
    return "moe" in parts and parts[-1] in _EXPERT_OPS


def resize_tokens(op: Op, n: int, h: int, ref: int) -> Op:
    """``op`` of the template (``REF_BATCH`` sequences of ``ref`` tokens, or one token per
    sequence after the last-token view) for ``n`` sequences of ``h`` tokens."""
    kind = op.kind
    loops = op.loop_dict
    if kind == OpKind.GEMM:
        return op.with_loops(B=n, M=h if loops["M"] == ref else loops["M"])
    if kind in (OpKind.ELTWISE, OpKind.NORM, OpKind.EMBEDDING):
        return op.with_loops(N=n, H=h if loops["H"] == ref else loops["H"])
    if kind == OpKind.RESHAPE:  # memory-only: the batch and token axes of every shape
        from dataclasses import replace

        def shape(s: tuple) -> tuple:
            return (n if s[0] == REF_BATCH else s[0], s[1], h if s[2] == ref else s[2], s[3])

        new = {"N": n, "H": h if loops["H"] == ref else loops["H"]}
        return replace(op, loops=tuple((k, new.get(k, v)) for k, v in op.loops),
                       in_shapes=tuple(shape(s) for s in op.in_shapes), out_shape=shape(op.out_shape))
    raise ValueError(f"{op.name}: no token-wise resize for {kind}")


def attention_loops(op: Op, count: int, q: int, ctx: int) -> dict[str, int]:
    """The loops of an attention-core op of the template for ``count`` sequences of ``q``
    queries over ``ctx`` keys."""
    if op.kind == OpKind.SOFTMAX:
        return {"N": count, "H": q, "L": ctx}
    if op.param("b_feature") == "N":  # P V: the keys are the contraction
        return {"B": count, "M": q, "K": ctx}
    return {"B": count, "M": q, "N": ctx}  # Q K^T, or the fused kernel
