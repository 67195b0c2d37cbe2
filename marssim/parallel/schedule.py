"""Pipeline schedules: the order in which each stage runs the forward and backward passes of its
model chunks over the micro-batches, exactly as Megatron-LM orders them.

A *unit* is ``(chunk, micro-batch, "F" or "B")``: the forward or backward pass of one model
chunk (a run of layers) for one micro-batch. Stage ``s`` of ``p`` holds chunk ``s`` (and, with
``v`` virtual stages, chunks ``s, s + p, ..., s + (v-1)p``).

* ``gpipe``: all forwards, then all backwards (micro-batches in reverse, as GPipe flushes).
* ``1f1b`` (PipeDream-Flush, Narayanan et al. 2021): ``min(p - s - 1, m)`` warm-up forwards,
  then alternately one forward and one backward, then the remaining backwards; at most
  ``p - s`` micro-batches are in flight on stage ``s``.
* ``interleaved`` (Narayanan et al. 2021, section 2.2; Megatron-LM's
  ``forward_backward_pipelining_with_interleaving``): forward unit ``k`` of a stage runs chunk
  ``(k mod p*v) div p`` on micro-batch ``(k div p*v)*p + k mod p`` (backwards take the chunks in
  reverse), with ``(p - s - 1)*2 + (v - 1)*p`` warm-up forwards; needs ``m`` divisible by ``p``.
"""

from __future__ import annotations

__all__ = ["stage_units", "Unit"]

Unit = tuple[int, int, str]
"""``(chunk index, micro-batch, "F" | "B")``."""


def _interleaved_chunk(k: int, p: int, v: int, forward: bool) -> int:
    in_group = k % (p * v)
    chunk = in_group // p
    return chunk if forward else v - 1 - chunk


def _interleaved_mb(k: int, p: int, v: int) -> int:
    return (k // (p * v)) * p + k % p


def stage_units(schedule: str, stage: int, stages: int, micro_batches: int, virtual: int = 1,
                forward_only: bool = False) -> list[Unit]:
    """The units stage ``stage`` of ``stages`` runs, in order (chunk indices are global: model
    chunk ``c`` runs on stage ``c mod stages``). ``forward_only``: no backward (serving)."""
    p, m, s = stages, micro_batches, stage
    if forward_only:
        if schedule == "interleaved":
            return [(s + (_interleaved_chunk(k, p, virtual, True)) * p, _interleaved_mb(k, p, virtual), "F")
                    for k in range(m * virtual)]
        return [(s, mb, "F") for mb in range(m)]
    if schedule == "gpipe":
        return [(s, mb, "F") for mb in range(m)] + [(s, mb, "B") for mb in reversed(range(m))]
    if schedule == "1f1b":
        warmup = min(p - s - 1, m)
        units: list[Unit] = [(s, mb, "F") for mb in range(warmup)]
        for i in range(m - warmup):
            units.append((s, warmup + i, "F"))
            units.append((s, i, "B"))
        units += [(s, mb, "B") for mb in range(m - warmup, m)]
        return units
    if schedule == "interleaved":
        v = virtual
        total = m * v
        warmup = min((p - s - 1) * 2 + (v - 1) * p, total)

        def fwd(k: int) -> Unit:
            return (s + _interleaved_chunk(k, p, v, True) * p, _interleaved_mb(k, p, v), "F")

        def bwd(k: int) -> Unit:
            return (s + _interleaved_chunk(k, p, v, False) * p, _interleaved_mb(k, p, v), "B")

        units = [fwd(k) for k in range(warmup)]
        for i in range(total - warmup):
            units.append(fwd(warmup + i))
            units.append(bwd(i))
        units += [bwd(k) for k in range(total - warmup, total)]
        return units
    raise ValueError(f"unknown schedule {schedule!r}")
