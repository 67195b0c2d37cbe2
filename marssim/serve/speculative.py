"""Speculative decoding as the engines run it (vLLM, SGLang, TensorRT-LLM): the draft that
proposes tokens, the verification that checks them, the tokens accepted, and the draft's memory.

A pool with ``spec_method`` (:mod:`.deployment`) decodes each of its sequences in steps of:

1. ``k`` draft forward passes (``spec_k``), each over the decode batch with one token per
   sequence: a smaller LLM (``spec_method=draft``, ``spec_model``: same vocabulary, run on the
   replica's GPUs at the replica's tensor parallelism, with its own KV cache) or MTP/EAGLE-style
   draft heads (``spec_method=mtp``: ``spec_layers`` transformer blocks of the model's width, with
   the model's embedding and output projection, one pass per proposed token);
2. one verification pass of the target model over ``k + 1`` tokens per sequence (the last
   sampled token and the ``k`` proposed), timed by the iteration model as a prefill-like chunk of
   ``q = k + 1`` queries over the sequence's context, its KV written for the ``k + 1`` tokens and
   its logits computed at each of them;
3. the accepted proposals drawn per sequence: each proposed token is accepted with probability
   ``alpha`` (``spec_alpha``, independently), the step keeps the proposals before the first
   rejection, ``a`` of them, and the target's own token after them: ``a + 1`` tokens (at most the
   tokens the request still has to generate), with mean :func:`expected_tokens_per_step`
   ``(1 - alpha^(k+1)) / (1 - alpha)``. The KV cache keeps the ``a + 1`` tokens' entries; the
   blocks of the rejected slots go back.

Prompt chunks in the same iteration are run by the draft too (it needs their keys and values).
The tokens of a step reach the user together; their gaps (TBT) are the step's time split evenly
among them, so TPOT and the TBT distribution count every emitted token. Memory: the draft's
weights (an MTP head's blocks; its embedding and output projection are the model's) and its KV
cache for every cached token come out of the KV-cache budget (:func:`draft_memory`).

Not modelled: the draft catching up over the tokens accepted in the previous step (it feeds one
token per pass), tree attention over several candidate branches, and the draft's workspace.
Speculative decoding applies to ``pp=1`` replicas. Units: seconds, bytes.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from marssim.errors import InputError
from marssim.workload.llm.config import TransformerConfig
from marssim.workload.op import DTYPE_BYTES

from .batchshape import batch_shape
from .deployment import Pool, SchedulerConfig
from .itermodel import REF_BATCH, IterationModel
from .poolcheck import check_pool
from .schedulers import Work

__all__ = ["expected_tokens_per_step", "draw_accepted", "draft_config", "draft_memory", "SpecTimer"]


def expected_tokens_per_step(k: int, alpha: float) -> float:
    """Mean tokens one speculative step emits for a sequence: accepted proposals and the target's
    own token, ``sum_{j=0..k} alpha^j = (1 - alpha^(k+1)) / (1 - alpha)`` (``k + 1`` at alpha 1)."""
    if alpha >= 1.0:
        return float(k + 1)
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def draw_accepted(rng: np.random.Generator, n: int, k: int, alpha: float) -> np.ndarray:
    """Accepted proposals of ``n`` sequences' steps: the leading successes of ``k`` independent
    trials of probability ``alpha`` (``P(a >= j) = alpha^j``), drawn from one uniform each;
    exactly ``k`` at alpha 1 and 0 at alpha 0, without drawing."""
    if alpha >= 1.0:
        return np.full(n, k, dtype=np.int64)
    if alpha <= 0.0:
        return np.zeros(n, dtype=np.int64)
    u = rng.random(n)
    # u <= alpha^j  <=>  log(u) / log(alpha) >= j
    with np.errstate(divide="ignore"):
        a = np.floor(np.log(u) / math.log(alpha))
    return np.minimum(a, k).astype(np.int64)


def draft_config(target: TransformerConfig, pool: Pool, where: str, prefix: str) -> TransformerConfig:
    """The model of the pool's draft: ``spec_model`` (a draft model) or ``spec_layers`` blocks of
    the target (MTP heads). InputError when the draft cannot serve beside the target."""
    from .model import load_model

    cfg = pool.scheduler
    if cfg.spec_method == "mtp":
        return replace(target, layers=cfg.spec_layers)
    try:
        draft = load_model(cfg.spec_model)
    except InputError as err:
        raise InputError(where, prefix + "spec_model", f"{cfg.spec_model!r}: {err}") from None
    if draft.vocab != target.vocab:
        raise InputError(where, prefix + "spec_model", f"the draft's vocabulary ({draft.vocab:,} tokens) differs from "
                                                       f"the model's ({target.vocab:,}); expected a draft of the "
                                                       "same tokenizer")
    try:
        check_pool(pool, draft, where, prefix)
    except InputError as err:
        raise InputError(where, prefix + "spec_model", f"the draft model: {err}") from None
    return draft


def draft_memory(draft: IterationModel, method: str) -> tuple[float, float]:
    """``(weight bytes, KV-cache bytes per cached token)`` of the draft on each GPU of a
    ``pp=1`` replica: a draft model's parameters, or an MTP head's blocks (its embedding and
    output projection are the model's, already counted), at its tensor-parallel split."""
    from marssim.parallel.config import ParallelConfig
    from marssim.parallel.memory import rank_parameters

    t = draft.config
    eb = DTYPE_BYTES[t.dtype]
    per, _ = rank_parameters(draft.graph, ParallelConfig(tp=draft.tp, micro_batch=REF_BATCH), draft.rules)
    dense, main = draft.stage_blocks[0]
    params = main * per.get(draft.main_layer, 0) + (dense * per.get(0, 0) if dense else 0)
    if method == "draft":
        params += per.get(-1, 0) + per.get(draft.template_layers, 0)
    kv = t.layers * 2 * -(-t.kv // draft.tp) * t.d_head * eb
    return float(params * eb), float(kv)


class SpecTimer:
    """The times of a speculative engine iteration on a ``pp=1`` replica: ``target`` times the
    verification (and prompt chunks), ``draft`` the proposals, ``k`` proposals per step."""

    def __init__(self, target: IterationModel, draft: IterationModel, cfg: SchedulerConfig) -> None:
        if target.pp != 1 or draft.pp != 1:
            raise InputError(None, "spec_method", "speculative decoding is modelled for pp=1 replicas")
        self.target = target
        self.draft = draft
        self.k = cfg.spec_k
        self.alpha = cfg.spec_alpha
        self.method = cfg.spec_method

    def verify_shape(self, work) -> tuple:
        """The arguments of :meth:`IterationModel.stage_times` for ``work`` with every decoding
        sequence verified as a chunk of ``k + 1`` tokens (one group at their mean context, as
        decode attention is timed), and prompt chunks as without speculation."""
        q = self.k + 1
        d = len(work.decodes)
        shape, pt = batch_shape(work)
        if not d:
            return shape
        ctx_total = 0
        for s in work.decodes:
            ctx_total += s.computed + q
        ctx = self.target.decode_context(d, ctx_total)
        pre_groups = shape[2]
        groups = tuple(sorted(pre_groups + ((d, q, ctx),)))
        prefill_logits = shape[5] - d
        if work.prefills:
            pf = pt
            tokens = (1, pf + d * q)
            kv = (1, pf + d * q)
        else:
            tokens = (d, q)
            kv = (d, q)
        return tokens, kv, groups, 0, 0, prefill_logits + d * q

    def draft_time(self, work) -> float:
        """Seconds of the draft in ``work``: its pass over the prompt chunks, then ``k`` passes of
        one token per decoding sequence at contexts growing by one."""
        draft = self.draft
        total = 0.0
        if work.prefills:
            only = Work()
            only.prefills = work.prefills
            shape, _ = batch_shape(only)
            total += draft.stage_times(*shape)[0]
        d = len(work.decodes)
        if d:
            ctx = 0
            for s in work.decodes:
                ctx += s.computed + 1
            for j in range(self.k):
                total += draft.stage_times((d, 1), (0, 0), (), d, ctx + d * j, d)[0]
        return total
