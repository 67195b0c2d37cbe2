"""The tensor-parallel role of each GEMM of a transformer graph, declared by the graph builder on
the op (param ``tp_role``) rather than guessed from its name: Megatron-LM's column-parallel
linear layers (Q/K/V, MLP up/gate/fc1, the experts' first GEMMs, the output layer over the
vocabulary) split their output features; its row-parallel ones (attention output, MLP down/fc2,
the experts' last GEMM) split their input features; the MoE router and the shared experts' gate
score keep their weights whole on every rank. The backward GEMMs (``.dgrad``, ``.wgrad``) and the
recomputed copies (``.recompute``) carry the role of the forward GEMM they derive from.
:mod:`marssim.parallel.roles` turns a role into tensor layouts and collectives.
"""

from __future__ import annotations

from enum import Enum

from marssim.workload.op import Op

__all__ = ["TP_ROLE", "TpRole", "tp_role"]

TP_ROLE = "tp_role"
"""The op param holding a GEMM's :class:`TpRole`."""


class TpRole(str, Enum):
    """How a GEMM's weights are split over a tensor-parallel group."""

    COLUMN = "column"
    """Split along the output features: the input whole on every rank, the output split."""
    ROW = "row"
    """Split along the input features: the input split, every rank a partial sum of the output."""
    REPLICATED = "replicated"
    """Whole on every rank: the input and output in the hidden state's layout."""


def tp_role(op: Op) -> TpRole | None:
    """The role the graph builder declared on ``op``; None for an op without one (not a GEMM of a
    transformer graph)."""
    return op.param(TP_ROLE)
