"""Schedule perturbations and cubin patching.

Two moves, both an adjacent swap checked by :class:`~.deps.Legality`:

* SIP's move: pick a memory instruction (global/shared/local/generic load, store, atomic) and
  move it one slot up or down;
* a general adjacent swap of any two instructions.

A schedule is a tuple ``order`` (``order[slot]`` = original index). :func:`patch` writes the
cubin with that order (under ``reuse="clear"``, :func:`patch_for` also clears the operand-reuse
flags the new order invalidates); :func:`roundtrip_mismatches` checks with ``nvdisasm`` that the
patched cubin reads back as the same instructions in the new order (without ``.reuse`` on
those).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

from collections.abc import Collection

from .cubin import Cubin, parse_cubin, permute_text
from .deps import Legality, reuse_cleared
from .sass import Listing, disassemble

__all__ = ["Move", "MOVE_KINDS", "apply_swap", "legal_swaps", "sip_moves", "sip_move_reasons", "random_move", "patch",
           "patch_for",
           "cleared_for", "roundtrip_mismatches", "replay"]

MOVE_KINDS = ("sip", "swap")


@dataclass(frozen=True, slots=True)
class Move:
    """Swap of slots ``pos`` and ``pos + 1``; ``moved`` is the slot (pos or pos + 1) of the
    instruction the move was chosen for (for SIP moves, the memory instruction)."""

    pos: int
    moved: int

    @property
    def direction(self) -> str:
        return "up" if self.moved == self.pos + 1 else "down"


def apply_swap(order: Sequence[int], pos: int) -> tuple[int, ...]:
    """``order`` with slots ``pos`` and ``pos + 1`` exchanged."""
    out = list(order)
    out[pos], out[pos + 1] = out[pos + 1], out[pos]
    return tuple(out)


def legal_swaps(legality: Legality, order: Sequence[int]) -> list[int]:
    """Every slot ``pos`` whose swap with ``pos + 1`` is legal."""
    return [p for p in range(len(order) - 1) if legality.check(order, p)]


def sip_moves(legality: Legality, order: Sequence[int]) -> list[Move]:
    """Every legal SIP move: a memory instruction one slot up or down."""
    insns = legality.insns
    out = []
    for slot, idx in enumerate(order):
        if insns[idx].mem is None:
            continue
        if slot > 0 and legality.check(order, slot - 1):
            out.append(Move(slot - 1, slot))
        if slot + 1 < len(order) and legality.check(order, slot):
            out.append(Move(slot, slot))
    return out


def sip_move_reasons(legality: Legality, order: Sequence[int]) -> list[tuple[str, ...]]:
    """For every refused SIP move of ``order`` (a memory instruction one slot up or down), the
    names of all the rules that refuse it (:meth:`~.deps.Legality.reasons`)."""
    insns = legality.insns
    out = []
    for slot, idx in enumerate(order):
        if insns[idx].mem is None:
            continue
        for pos in (slot - 1, slot):
            if 0 <= pos < len(order) - 1:
                rules = tuple(dict.fromkeys(v.reason for v in legality.reasons(order, pos)))
                if rules:
                    out.append(rules)
    return out


def random_move(rng: random.Random, legality: Legality, order: Sequence[int], kind: str = "sip") -> Move | None:
    """A uniformly chosen legal move of ``kind`` (``sip`` or ``swap``), or None if there is none.

    Candidates are visited in a random order and the first legal one is taken, which is uniform
    over the legal moves and deterministic for a seeded ``rng``."""
    insns = legality.insns
    if kind == "sip":
        candidates = [(slot, d) for slot, idx in enumerate(order) if insns[idx].mem is not None for d in (-1, 1)]
    elif kind == "swap":
        candidates = [(p, 1) for p in range(len(order) - 1)]
    else:
        raise ValueError(f"unknown move kind {kind!r}; expected one of {MOVE_KINDS}")
    rng.shuffle(candidates)
    for slot, d in candidates:
        pos = slot - 1 if d < 0 else slot
        if 0 <= pos < len(order) - 1 and legality.check(order, pos):
            return Move(pos, slot if kind == "sip" else pos)
    return None


def replay(legality: Legality, swaps: Sequence[int], start: Sequence[int] | None = None) -> tuple[int, ...]:
    """Apply swaps (slot positions) in turn, checking each is legal in the order it meets;
    ``ValueError`` names the first illegal one."""
    order = tuple(range(len(legality.insns))) if start is None else tuple(start)
    for step, pos in enumerate(swaps):
        verdict = legality.check(order, pos)
        if not verdict:
            raise ValueError(f"swap {step} (slots {pos}, {pos + 1}) is illegal: {verdict.reason} {verdict.detail}")
        order = apply_swap(order, pos)
    return order


def patch(cubin: Cubin, kernel: str, order: Sequence[int], clear_reuse: Collection[int] = ()) -> bytes:
    """The cubin's bytes with ``kernel``'s instructions in ``order``, the reuse flags of the
    instructions in ``clear_reuse`` cleared (see :func:`permute_text`)."""
    return permute_text(cubin, kernel, order, clear_reuse)


def cleared_for(legality: Legality, order: Sequence[int]) -> frozenset[int]:
    """The instructions whose reuse flags ``order`` needs cleared: none unless the legality model
    allows separating reuse pairs (``reuse="clear"``), then :func:`~.deps.reuse_cleared`."""
    return reuse_cleared(legality.listing, order) if legality.options.reuse == "clear" else frozenset()


def patch_for(legality: Legality, cubin: Cubin, order: Sequence[int]) -> bytes:
    """:func:`patch` of ``legality``'s kernel with the reuse flags its options require cleared."""
    return patch(cubin, legality.listing.kernel, order, cleared_for(legality, order))


def roundtrip_mismatches(original: Listing, patched: bytes, kernel: str, order: Sequence[int],
                         clear_reuse: Collection[int] = ()) -> list[str]:
    """Disassemble ``patched`` and compare: slot ``i`` must print exactly the text of original
    instruction ``order[i]`` (without ``.reuse`` when it is in ``clear_reuse``). Returns one line
    per difference (empty = identical up to order)."""
    new = disassemble(parse_cubin(patched), kernel)[kernel]
    problems = []
    if len(new) != len(original):
        return [f"{len(new)} instructions after patching, {len(original)} before"]
    for slot, idx in enumerate(order):
        got, want = new.instructions[slot].text, original.instructions[idx].text
        if idx in clear_reuse:
            want = want.replace(".reuse", "")
        if got != want:
            problems.append(f"slot {slot}: {got!r} != original {idx}: {want!r}")
    return problems
