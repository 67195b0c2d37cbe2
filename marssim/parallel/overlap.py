"""The distributed optimizer's parameter all-gather and the pipeline's sends as Megatron-LM
overlaps them, or not, and the per-step FP8 weight casts after the optimizer step.

* ``overlap_param_gather`` (``--overlap-param-gather``, ``zero`` 1 or 2): the all-gather of the
  updated parameters leaves the optimizer step and runs before the next forward, bucket by
  bucket (the gradient buckets, first layers first), one after another on the communication
  stream; a layer's first forward kernel waits for its bucket (Megatron-LM's forward pre-hook,
  ``finish_param_sync``). One iteration is simulated in its steady state: the gathers start it,
  each model chunk's at once (``align_param_gather``), and its optimizer step gathers nothing.
* ``overlap_p2p_comm`` off (Megatron-LM's 1F1B, and its interleaved schedule with
  ``--no-overlap-p2p-communication``): the batched send and receive of a pipeline step are
  waited for before the next kernel, so a GPU's first kernel after a unit that sends an
  activation or a gradient waits until the send has completed. The receiver's side waits for
  what it reads either way. (The rendezvous of a send with the receiver's posted receive is not
  modelled: the transfer starts when the sender's data is ready.) On: the sends are asynchronous.
* after each parameter group's AdamW step, ``<group>.fp8_weights`` (:mod:`marssim.workload.llm.precision`)
  casts the group's FP8 GEMM weights: with ``fp8_param_gather`` on the rank's ``1/(dp x cp)``
  shard before the all-gather (which then moves FP8 bytes:
  :func:`marssim.workload.llm.precision.param_gather_bytes`), otherwise on all of the rank's
  weights after it (Transformer Engine casts them in the first micro-batch's forward; the kernel
  is the same).

Units: bytes, seconds.
"""

from __future__ import annotations

from marssim.workload import Op

from .memo import graph_cached
from .memory import low_precision_rank_parameters, weight_cast_parameters
from .patterns import DP_RING

__all__ = ["gather_bytes", "low_precision_parameters", "param_gather_unit", "param_gather_deps", "after_steps",
           "sends_block", "gather_buckets", "cast_timing", "step_casts"]


def low_precision_parameters(low) -> dict[int, int]:
    """Per layer group: the parameters one rank holds of GEMMs whose weights a low-precision
    recipe casts (their ``w_dtype``), split as :func:`.memory.rank_parameters` splits them."""
    return graph_cached(low.graph, ("low_precision_parameters", low.rules_key),
                        lambda: low_precision_rank_parameters(low.graph, low.cfg, low.rules))


def gather_bytes(low, layers) -> float:
    """Bytes of one rank's parameters of ``layers`` as the distributed optimizer all-gathers them:
    the model's type, the FP8 GEMM weights in FP8 with ``fp8_param_gather``."""
    from marssim.workload.llm.precision import param_gather_bytes

    t = low.t
    params = sum(low.rank_params.get(layer, 0) for layer in layers)
    if not t.fp8_param_gather:
        return params * low.param_bytes
    low_params = sum(low_precision_parameters(low).get(layer, 0) for layer in layers)
    return (params - low_params) * low.param_bytes + low_params * param_gather_bytes(t)


def gather_buckets(layers, rank_params: dict[int, int], bucket: int) -> list[list[int]]:
    """The layers of each gradient bucket, in the order gradients complete (later layers first,
    a bucket closed once it holds ``bucket`` parameters), as the lowering's reduction forms them."""
    buckets: list[list[int]] = []
    size = 0
    for layer in sorted(layers, reverse=True):
        if not buckets or size >= bucket:
            buckets.append([])
            size = 0
        buckets[-1].append(layer)
        size += rank_params.get(layer, 0)
    return buckets


def param_gather_unit(b) -> None:
    """The unit ``(chunk, "G")``: the chunk's parameter all-gathers, bucket by bucket in forward
    order; the template records each layer's refs (``gathered``)."""
    low = b.low
    cfg = low.cfg
    chunk = b.key[0]
    gathered: dict[int, tuple] = {}
    ready: tuple = ()
    adams = {op.param("layer"): op.name for op in low.unit_ops.get((chunk, "O"), []) if op.param("fn") == "adam"}
    for bucket in reversed(gather_buckets(sorted(adams), low.rank_params, cfg.bucket)):
        nbytes = gather_bytes(low, bucket)
        ready = b.ring("all_gather", "dp", DP_RING, nbytes, cfg.dp_cp, adams[min(bucket)], ready) \
            if nbytes > 0 else ready
        for layer in bucket:
            gathered[layer] = ready
    b.t.gathered = gathered


def param_gather_deps(b, op: Op) -> tuple:
    """The refs the first forward kernel of a layer waits for under ``overlap_param_gather``: its
    bucket's all-gather (the one instance of the chunk's gather unit)."""
    low = b.low
    if not low.cfg.overlap_param_gather or b.key[1] != "F" or not low.training:
        return ()
    firsts = getattr(b, "_first_of_layer", None)
    if firsts is None:
        firsts = b._first_of_layer = {}
        for o in low.unit_ops.get(b.key, []):
            firsts.setdefault(o.param("layer"), o.name)
    if firsts.get(op.param("layer")) != op.name:
        return ()
    gather = b.templates.get(b.rep, (b.key[0], "G"))
    refs = getattr(gather, "gathered", {}).get(op.param("layer"), ())
    return tuple(r.at_last() for r in refs)


def cast_timing(low, gpu: int, op: Op, count: int) -> tuple[float, float, float, float]:
    """``(seconds, FLOPs, joules, output bytes)`` of the weight cast ``op`` over ``count``
    parameters on ``gpu``, memoised with the lowering's shards."""
    design = low.design(gpu)
    key = ("fp8_weights", low.shape_key(op), design.name, count)
    hit = low.shard_cache.get(key)
    if hit is not None:
        low.cost_models.setdefault(op.name, hit[1])
        return hit[0]
    part = op.with_loops(C=max(1, count))
    c = low.cost.op_cost(part, design)
    low.cost_models.setdefault(op.name, c.model)
    timing = (float(c.time), float(part.flops), float(c.energy), 0.0)
    low.shard_cache.put(key, (timing, c.model))
    return timing


def step_casts(low, layer: int) -> tuple[Op | None, int]:
    """The FP8 weight cast after group ``layer``'s optimizer step and the parameters it casts on
    one rank (``(None, 0)`` without one): the rank's shard with ``fp8_param_gather`` and a
    distributed optimizer, all the rank's FP8 weights otherwise."""
    chunk = low.chunk_of_layer.get(layer)
    cast = next((op for op in low.unit_ops.get((chunk, "O"), []) if op.param("weights") and
                 op.param("layer") == layer), None)
    count = low_precision_parameters(low).get(layer, 0) if cast is not None else 0
    if not count:
        return None, 0
    return cast, weight_cast_parameters(count, low.cfg, low.t.fp8_param_gather)


def after_steps(b, steps: list[tuple[int, Op, int]]) -> None:
    """What follows a chunk's AdamW steps (``(layer, step op, task of the unit)`` in the order
    they ran): each group's FP8 weight cast and the distributed optimizer's parameter all-gather,
    which Megatron-LM starts once every group is updated (``start_param_sync`` after the step),
    bucket by bucket in forward order; see the module docstring."""
    low = b.low
    cfg = low.cfg
    if not steps:
        return
    later: dict[int, tuple[Op, int, int]] = {}
    for layer, _, rel in steps:
        cast, count = step_casts(low, layer)
        if cast is None:
            continue
        if low.t.fp8_param_gather:  # the shard cast to FP8, then gathered in FP8
            b.compute(cast, (b.me(rel),), timing=cast_timing(low, b.rep, cast, count), kernels=1)
        else:
            later[layer] = (cast, count, rel)
    ready_of: dict[int, tuple] = {}
    if cfg.zero in (1, 2) and cfg.dp_cp > 1 and not cfg.overlap_param_gather:  # ZeRO-3 gathers per module
        ready: tuple = (b.me(b.t.last_compute),)
        names = {layer: adam.name for layer, adam, _ in steps}
        for bucket in reversed(gather_buckets(sorted(names), low.rank_params, cfg.bucket)):
            ready = b.ring("all_gather", "dp", DP_RING, gather_bytes(low, bucket), cfg.dp_cp, names[min(bucket)], ready)
            for layer in bucket:
                ready_of[layer] = ready
    for layer, (cast, count, rel) in later.items():  # the gathered (or whole) weights cast for the next step
        b.compute(cast, ready_of.get(layer, (b.me(rel),)), timing=cast_timing(low, b.rep, cast, count),
                  kernels=1)


def sends_block(low, key: tuple[int, str]) -> bool:
    """Whether the unit ``key`` (chunk, direction) sends to another pipeline stage with blocking
    sends (``overlap_p2p_comm`` off, Megatron-LM's default): a forward chunk before the last, a
    backward chunk after the first. Its GPU's next kernel then waits for the sends' end (a
    zero-length task after the unit's last kernel, which every receiver's transfer precedes)."""
    chunk, direction = key
    if low.cfg.overlap_p2p_comm or low.cfg.pp < 2 or not low.training or not low.unit_ops.get(key):
        return False
    return (direction == "F" and chunk < len(low.chunks) - 1) or (direction == "B" and chunk > 0)

