"""Context parallelism: the attention core as a ring over the context-parallel group, as
Transformer Engine's ``AttnFuncWithCPAndKVP2P`` runs it (``cp_comm_type="p2p"``, Megatron-LM's
default).

Each sequence is cut into ``2 cp`` chunks and rank ``i`` of the group keeps chunks ``i`` and
``2 cp - 1 - i`` (Megatron-LM's ``get_batch_on_this_cp_rank``): under a causal mask every rank
then has the same work. Every op but the attention core runs on the rank's ``seq / cp`` tokens
(the lowering builds the micro-batch's graph at that length); the core needs every key and value
of the sequence, so it runs in ``cp`` steps, one per key/value block:

* forward, step ``j``: the local queries against the block of rank ``i - j``; the block for step
  ``j + 1`` is sent on to the next rank while step ``j`` computes (the transfer that brings it
  waits only for the sender to hold the block): ``cp - 1`` transfers of one block;
* backward, step ``j``: the gradients of the local queries and of block ``i - j``; the block's
  key/value gradients travel with the next block (Transformer Engine's ``[kv, dkv]`` buffers):
  step 0 sends the block, steps ``1 .. cp - 2`` the block and the gradients accumulated so far
  (they wait for the step before), step ``cp - 1`` the gradients only, which reach their owner;
  ``2 (cp - 1)`` blocks in all.

Work per step: step 0 is the causal block of the local chunks, each other step half a block
without a mask (one chunk of queries against two of keys, or two against one); both are the
work of the local causal block, so every step is timed as the ``seq / cp`` graph's core op (its
calibration rows, causal where measured so). FLOPs follow the workload's convention (a causal
product counts its full ``M x N`` work): every step counts the ``(seq/cp)^2`` block, so the
``cp`` steps of the ``cp`` ranks count the unsplit core's FLOPs exactly.

Units: bytes, seconds.
"""

from __future__ import annotations

from collections.abc import Callable

from .patterns import CP_RING

__all__ = ["RING_PATTERN", "is_ring_core", "kv_bytes", "ring_volume", "forward_ring_end", "backward_ring_end",
           "ring_core", "kv_buffer_bytes"]

RING_PATTERN = CP_RING
"""The placement pattern of the context-parallel ring (:meth:`.placement.Placement.patterns`)."""


def is_ring_core(op, cp: int) -> bool:
    """True for a fused attention core (forward, recomputed forward or backward) that runs as
    the context-parallel ring."""
    return cp > 1 and op.param("fused") in ("fwd", "bwd")


def kv_bytes(layout_bytes: Callable[[str, str], float], op) -> float:
    """Bytes of the keys and values one rank holds for the fused core ``op`` (its inputs 1 and
    2, split by heads over the tensor-parallel group): the block a ring step moves."""
    return layout_bytes(op.inputs[1], "F") + layout_bytes(op.inputs[2], "F")


def ring_volume(cp: int, kv: float, backward: bool) -> float:
    """Bytes one rank sends for one core op: ``(cp - 1) kv`` forward, ``2 (cp - 1) kv``
    backward (blocks and their gradients)."""
    return (2.0 if backward else 1.0) * (cp - 1) * kv


def forward_ring_end(step: float, block: float, cp: int) -> float:
    """Seconds from the start of a forward core to the end of its last step, nothing contending:
    ``cp`` steps of ``step`` seconds, block transfers of ``block`` seconds in a chain (step ``j``
    waits for transfer ``j``, which ends at ``j * block``): ``max_j (j block + (cp - j) step)``,
    i.e. ``max(cp step, (cp - 1) block + step)``."""
    return max(cp * step, (cp - 1) * block + step)


def backward_ring_end(step: float, block: float, both: float, cp: int) -> float:
    """Seconds from the start of a backward core to its key/value gradients' arrival, nothing
    contending: ``cp`` steps of ``step`` seconds; transfer ``j`` (``block`` seconds for a block or
    for its gradients alone, ``both`` for a block with gradients) leaves once the rank has received
    transfer ``j - 1`` and run step ``j - 1``, step ``j`` once transfer ``j - 1`` has arrived."""
    if cp <= 1:
        return step
    compute_end = step  # step 0
    sent = block  # transfer 0: the block alone, beside step 0
    for j in range(1, cp):
        leaves = max(sent, compute_end)
        compute_end = max(compute_end, sent) + step
        sent = leaves + (both if j < cp - 1 else block)  # the last transfer: the gradients only
    return max(compute_end, sent)


def kv_buffer_bytes(cp: int, kv: float, out: float) -> float:
    """Bytes of the ring's buffers while one layer's core runs: forward, the ``cp - 1`` blocks
    received and the ``cp`` per-step outputs (``out``: bytes of the local context) Transformer
    Engine keeps until it corrects them; backward, two ``[kv, dkv]`` buffers (``4 kv``)."""
    if cp <= 1:
        return 0.0
    return max((cp - 1) * kv + cp * out, 4.0 * kv)


def ring_core(b, op, deps: tuple) -> tuple:
    """Add the ring steps of the fused core ``op`` to the unit builder ``b`` (a
    :class:`.builder.UnitBuilder`) and return the refs after which its output is ready on this rank.

    The ring's ranks are either one class of the folding (their steps in lockstep: a transfer a
    rank receives stands for the one it sends) or each its own; a step refers to its predecessor
    on the previous rank by the same position in that rank's unit, as the ring collectives do."""
    low = b.low
    cp = low.cfg.cp
    backward = op.param("fused") == "bwd"
    kv = kv_bytes(low.layout_bytes, op)
    peer = low.place.patterns()[RING_PATTERN]
    nxt = peer(b.rep)
    prv = next(g for g in b.group(RING_PATTERN) if peer(g) == b.rep)
    prv_rep = low.fold.rep(prv)
    coll = b.collective("p2p", "cp", RING_PATTERN, ring_volume(cp, kv, backward), op.name, 2 * cp - 2 if backward
                         else cp - 1, "ring")

    def theirs(rel: int) -> tuple:  # the previous rank's task at the same position of its unit
        return b.peer_ref(prv_rep, rel)

    # the first transfer is launched with the core: after the kernel before it on this GPU's stream
    # (a send waits for the stream's earlier work, as PyTorch's NCCL process group makes it)
    deps = tuple(deps) + ((b.me(b.t.last_compute),) if b.t.last_compute >= 0 else ())
    if not backward:
        compute = b.compute(op, deps)
        sends: list[int] = []
        for j in range(1, cp):
            # the block for step j: the sender holds it once it received it (step j - 1's transfer)
            send = b.flow(b.rep, nxt, kv, op.name, coll, deps if j == 1 else (theirs(sends[-1]),), hold=False,
                          pattern=RING_PATTERN)
            sends.append(send)
            compute = b.compute(op, (theirs(send),))
        return (b.me(compute),)
    compute = send = -1
    for j in range(cp):
        size = kv if j in (0, cp - 1) else 2 * kv
        # transfer j: after this rank received transfer j - 1 and ran step j - 1 (the gradients it adds)
        new_send = b.flow(b.rep, nxt, size, op.name, coll, deps if j == 0 else (theirs(send), b.me(compute)),
                          hold=False, pattern=RING_PATTERN)
        compute = b.compute(op, deps if j == 0 else (theirs(send),))  # step j: the block transfer j - 1 brought
        send = new_send
    return (b.me(compute), theirs(send))
