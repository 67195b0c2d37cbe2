"""The names of a parallel run's communication patterns: each maps a GPU to the peer it sends to
(:meth:`.placement.Placement.patterns`), one NCCL communicator's ring or the pipeline's neighbours.

A :class:`Pattern` is its name, a ``str`` (``tp+1``: the next rank of the tensor-parallel ring),
so that the maps keyed by patterns hash and order as their names do; :attr:`Pattern.group` and
:attr:`Pattern.step` read it. The patterns of a run: the rings of the tensor-, data-, context-,
expert-data- and expert-tensor-parallel groups, the ``k``-th peer of the expert-parallel group
(:func:`ep_peer`, an all-to-all's direct sends) and the pipeline transfers a stage pulls from the
next or the previous stage.
"""

from __future__ import annotations

__all__ = ["CP_RING", "DP_RING", "EDP_RING", "ETP_RING", "PULLS", "PULL_NEXT", "PULL_PREV", "TP_RING", "Pattern",
           "ep_peer"]


class Pattern(str):
    """A communication pattern's name, ``<group><step>`` with a signed step (``tp+1``, ``ep+3``,
    ``pull-1``)."""

    __slots__ = ()

    @classmethod
    def of(cls, group: str, step: int) -> Pattern:
        """The pattern of ``group`` to the rank ``step`` places on (``of("tp", 1)``: ``tp+1``)."""
        return cls(f"{group}{step:+d}")

    def _sign(self) -> int:
        return max(self.rfind("+"), self.rfind("-"))

    @property
    def group(self) -> str:
        """The group (``tp``, ``dp``, ``cp``, ``ep``, ``edp``, ``etp``) or ``pull``."""
        return self[:self._sign()]

    @property
    def step(self) -> int:
        """Ranks ahead in the group (negative: behind)."""
        return int(self[self._sign():])


TP_RING = Pattern.of("tp", 1)
DP_RING = Pattern.of("dp", 1)  # the data-parallel ring (dp x cp ranks)
CP_RING = Pattern.of("cp", 1)
EDP_RING = Pattern.of("edp", 1)  # the ranks holding the same experts' weights
ETP_RING = Pattern.of("etp", 1)
PULL_NEXT = Pattern.of("pull", 1)  # a stage's transfers from the next stage (gradients)
PULL_PREV = Pattern.of("pull", -1)  # a stage's transfers from the previous stage (activations)
PULLS = (PULL_NEXT, PULL_PREV)
"""Patterns whose flows go from the peer to the GPU (pipeline transfers are pulled by receivers)."""


def ep_peer(k: int) -> Pattern:
    """The expert-parallel group's ``k``-th peer (``ep+k``)."""
    return Pattern.of("ep", k)
