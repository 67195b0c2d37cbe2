"""Disaggregated prefill and decode (DistServe, Splitwise, Dynamo): which bytes of a prefilled
request's KV cache go from which prefill GPU to which decode GPU.

Each GPU of the decode replica needs the keys and values of its stage's layers for its key/value
heads. They come from the prefill GPU holding those layers (the prefill replica's stage) and those
heads (its tensor-parallel rank; when a head is replicated on several ranks, as when ``tp``
exceeds the key/value heads, the one with the same index modulo the replicas). So a transfer
between replicas of different ``tp`` or ``pp`` is the exact re-sharding, one flow per pair of
GPUs that exchange anything, all at once. Units: bytes per prompt token.
"""

from __future__ import annotations

from marssim.workload.llm.config import TransformerConfig
from marssim.workload.op import DTYPE_BYTES

from .itermodel import stage_layers

__all__ = ["kv_plan", "kv_heads"]


def kv_heads(tp: int, rank: int, kv: int) -> range:
    """The key/value heads tensor-parallel rank ``rank`` of ``tp`` holds (one, replicated, when
    ``tp`` exceeds ``kv``)."""
    if tp <= kv:
        return range(rank * kv // tp, (rank + 1) * kv // tp)
    h = rank * kv // tp
    return range(h, h + 1)


def _layer_ranges(layers: int, pp: int) -> list[range]:
    out, at = [], 0
    for n in stage_layers(layers, pp):
        out.append(range(at, at + n))
        at += n
    return out


def kv_plan(config: TransformerConfig, src: tuple[tuple[str, ...], ...],
            dst: tuple[tuple[str, ...], ...]) -> list[tuple[str, str, float]]:
    """``(source GPU, destination GPU, bytes per token)`` of moving a KV cache from a replica
    whose stages run on ``src`` (GPUs in tensor-parallel order) to one on ``dst``."""
    kv, d = config.kv, config.d_head
    per_head_layer = 2.0 * d * DTYPE_BYTES[config.dtype]
    src_layers = _layer_ranges(config.layers, len(src))
    dst_layers = _layer_ranges(config.layers, len(dst))
    out: dict[tuple[str, str], float] = {}
    for sd, gpus_d in enumerate(dst):
        tp_d = len(gpus_d)
        for rd, gd in enumerate(gpus_d):
            for sp, gpus_p in enumerate(src):
                overlap = len(range(max(dst_layers[sd].start, src_layers[sp].start),
                                    min(dst_layers[sd].stop, src_layers[sp].stop)))
                if overlap <= 0:
                    continue
                tp_p = len(gpus_p)
                for h in kv_heads(tp_d, rd, kv):
                    holders = [r for r in range(tp_p) if h in kv_heads(tp_p, r, kv)]
                    gp = gpus_p[holders[rd % len(holders)]]
                    out[(gp, gd)] = out.get((gp, gd), 0.0) + overlap * per_head_layer
    return [(a, b, v) for (a, b), v in sorted(out.items())]
