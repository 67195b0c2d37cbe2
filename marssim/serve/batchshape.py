"""One engine iteration's batch in the form the iteration model times it: the arguments of
:meth:`~.itermodel.IterationModel.stage_times` for a scheduler's :class:`~.schedulers.Work`
(its prompt chunks and decoding sequences), shared by the engine and speculative decoding."""

from __future__ import annotations

from .schedulers import Work

__all__ = ["batch_shape"]


def batch_shape(work: Work) -> tuple:
    """The arguments of :meth:`IterationModel.stage_times` for ``work``, and its token count."""
    prefills = work.prefills
    decodes = work.decodes
    d = len(decodes)
    if prefills:
        qs = [q for _, q in prefills]
        pt = sum(qs)
        equal = min(qs) == max(qs)
        groups: dict[tuple[int, int], int] = {}
        logits = d
        for s, q in prefills:
            ctx = s.computed + q
            groups[(q, ctx)] = groups.get((q, ctx), 0) + 1
            if ctx >= s.target:
                logits += 1
        group = tuple(sorted((c, q, ctx) for (q, ctx), c in groups.items()))
        kv = (len(prefills), qs[0]) if equal else (1, pt)
        tokens = (len(prefills), qs[0]) if equal and not d else (1, pt + d)
    else:
        pt = 0
        group = ()
        kv = (0, 0)
        tokens = (d, 1)
        logits = d
    context = 0
    for s in decodes:
        context += s.computed + 1
    return (tokens, kv, group, d, context, logits), pt + d
