"""Stall distances ptxas leaves between fixed-latency producers and their consumers.

A fixed-latency instruction (an ALU operation without a write scoreboard) is protected only by
the stall counts between it and the instructions that read its result: the consumer must not
issue before the result is written. ptxas knows each opcode's latency and never places a
consumer closer; so the smallest stall distance ptxas ever leaves between a producer opcode and
a consumer of a given kind, over many kernels, is at least that latency. :func:`observe`
collects those distances from listings and :func:`minima` reduces them to a table (per producer
mnemonic: a table per opcode would hold the smallest latency of its variants);
``latency_table.OBSERVED`` is the table of the test cubins (``analysis/sip_latencies.py``
regenerates it), which the legality model may use instead of its fixed 6-cycle bound
(:class:`marssim.calibrate.sip.deps.LegalityOptions`).

Only unambiguous pairs count, so that no distance below a latency is recorded:

* the producer is ``fixed`` (no scoreboard) and names its destination literally: the first
  operand (one register; the other registers of a wide result are not counted), the
  predicate of a compare, or a carry-out predicate;
* the consumer is the first later instruction of the same basic block that names the register
  literally, or stores it as a later register of its wide data operand (``STS.128 [R2], R4``
  stores R4..R7; slot ``2+``); any other implicit read of a wide operand stops the scan
  unrecorded;
* nothing between them, the consumer included, waits on a scoreboard or is a fence: a wait
  on a scoreboard whose setter has a known minimum latency delays the consumer by more than the
  stall counts, which ptxas may count on, so the scan stops there. Other instructions in
  between delay the consumer by at least their stall counts and by nothing ptxas can rely on
  (pipe throttling varies), so they count with their stall counts.

A consumer is classified by :func:`consumer_key`: its category (``fixed``, ``memory``,
``variable``, ``fence``), how it reads the register (``pred``: a guard or predicate operand,
``addr``: inside an address, ``data``: any other operand) and where (the operand's position
among the sources, or ``hi`` for the second register of a 64-bit address), because some
operands are read later than others (ptxas places the producer of the high half of a 64-bit
address or of a third operand closer). Keys are per architecture family (``sm_80``: Ampere and
Ada; ``sm_90``: Hopper).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from .sass import Instruction, Listing, _PRED_ONLY_DST

__all__ = ["LatencyKey", "observe", "minima", "tightening", "producer_defs", "consumer_key", "arch_family",
           "MMA_OPCODES"]

MMA_OPCODES = frozenset({"HMMA", "IMMA", "DMMA", "BMMA", "HGMMA", "IGMMA", "QGMMA", "BGMMA"})

_REG = re.compile(r"^U?R\d+$")
_PRED = re.compile(r"^U?P[0-6]$")
_ADDR = re.compile(r"(?<![\w.])(U?R)(\d+)(\.64)?")
_DESC = re.compile(r"g?desc\[(U?R)(\d+)\]")
_TOKEN = re.compile(r"(?<![\w.])(U?R\d+|U?P[0-6])\b")


@dataclass(frozen=True, slots=True, order=True)
class LatencyKey:
    """What a stall distance was observed for: ``family`` (``sm_80``/``sm_90``), the producer's
    mnemonic (opcode with every modifier: ``IMAD.WIDE.U32``, not ``IMAD``, since variants of
    one opcode may differ in latency), the consumer's category, the consumer's operand
    ``role`` and ``slot``."""

    family: str
    producer: str
    consumer: str
    role: str
    slot: str

    def label(self) -> str:
        return f"{self.family} {self.producer} -> {self.consumer} {self.role}[{self.slot}]"


def arch_family(arch: str) -> str:
    """``sm_90a`` -> ``sm_90``; ``sm_86`` -> ``sm_80``."""
    digits = "".join(ch for ch in arch if ch.isdigit())
    return f"sm_{digits[0]}0" if digits else arch


def producer_defs(ins: Instruction) -> frozenset[str]:
    """The registers and predicates a fixed-latency instruction names as its results, literally
    (empty for other instructions)."""
    if ins.category != "fixed" or ins.control.write_sb is not None or ins.opcode in MMA_OPCODES:
        return frozenset()
    ops = ins.operands
    if not ops:
        return frozenset()
    if ins.opcode in _PRED_ONLY_DST:
        return frozenset({ops[0]}) if _PRED.match(ops[0]) else frozenset()
    out = set()
    if _REG.match(ops[0]):
        out.add(ops[0])
        for op in ops[1:]:  # carry-out predicates follow the destination
            if _PRED.match(op):
                out.add(op)
            elif op not in ("PT", "UPT"):
                break
    return frozenset(out) & ins.writes


def _sources(ins: Instruction) -> list[tuple[int, str]]:
    """(source position, operand text) of the operands an instruction reads: its operands after
    the results (a compare's two predicates; leading predicates, a destination register and
    carry-out predicates otherwise)."""
    ops = ins.operands
    first = 0
    if ins.opcode in _PRED_ONLY_DST:
        while first < min(2, len(ops)) and (_PRED.match(ops[first]) or ops[first] in ("PT", "UPT")):
            first += 1
    elif ins.writes:
        while first < len(ops) and (_PRED.match(ops[first]) or ops[first] in ("PT", "UPT")):
            first += 1
        if first < len(ops) and _REG.match(ops[first]) and ops[first] in ins.writes:
            first += 1
            while first < len(ops) and (_PRED.match(ops[first]) or ops[first] in ("PT", "UPT")):
                first += 1
        else:
            first = 0  # no register result: the leading predicates are sources (a store's guard-like operands)
    return [(i - first + 1, op) for i, op in enumerate(ops) if i >= first]


def consumer_key(ins: Instruction, reg: str) -> tuple[str, str] | None:
    """``(role, slot)`` of ``reg`` among the sources ``ins`` names literally, or None when
    ``ins`` reads it only implicitly (a wide operand) or not at all. The earliest-read kind
    wins when a register appears twice."""
    if ins.guard and ins.guard.lstrip("@!") == reg:
        return ("pred", "guard")
    found: list[tuple[str, str]] = []
    for pos, op in _sources(ins):
        if "[" in op:
            for m in _DESC.finditer(op):
                n = int(m.group(2))
                if reg == f"{m.group(1)}{n}":
                    found.append(("addr", "desc"))
                elif reg == f"{m.group(1)}{n + 1}":
                    found.append(("addr", "desc-hi"))
            inner = _DESC.sub("", op)
            for m in _ADDR.finditer(inner):
                n = int(m.group(2))
                if reg == f"{m.group(1)}{n}":
                    found.append(("addr", "lo"))
                elif m.group(3) and reg == f"{m.group(1)}{n + 1}":
                    found.append(("addr", "hi"))
            continue
        for m in _TOKEN.finditer(op):
            if m.group(1) == reg:
                found.append(("pred" if "P" in reg else "data", str(pos)))
        if ins.mem is not None and ins.mem.writes and ins.mem.kind != "ldgsts":
            # the data of a wide store (STS.128 R4 stores R4..R7): exact, a slot of its own
            m = _TOKEN.fullmatch(op)
            width = ins.mem.size // 4
            if m and m.group(1).startswith("R") and width > 1:
                first, wanted = int(m.group(1)[1:]), reg[1:]
                if reg.startswith("R") and wanted.isdigit() and first < int(wanted) < first + width:
                    found.append(("data", f"{pos}+"))
    return min(found) if found else None


def observe(listings: Iterable[Listing]) -> dict[LatencyKey, list[int]]:
    """Stall distances of the unambiguous producer -> consumer pairs of ``listings`` (see the
    module docstring), by key."""
    out: dict[LatencyKey, list[int]] = {}
    for lst in listings:
        family = arch_family(lst.arch)
        insns = lst.instructions
        block_of = lst.block_of()
        for i, p in enumerate(insns):
            for reg in producer_defs(p):
                distance = 0
                for j in range(i + 1, len(insns)):
                    if block_of[j] != block_of[i]:
                        break
                    distance += insns[j - 1].control.stall
                    c = insns[j]
                    if c.control.wait_mask:
                        break
                    key = consumer_key(c, reg) if reg in c.reads else None
                    if key is not None:
                        out.setdefault(LatencyKey(family, p.mnemonic, c.category, *key), []).append(distance)
                        break
                    if reg in c.reads or reg in c.writes or c.category == "fence":
                        break
    return out


def minima(observed: dict[LatencyKey, list[int]], at_least: int = 2) -> dict[LatencyKey, tuple[int, int, int]]:
    """``{key: (smallest distance, observations, observations at the smallest distance)}`` for
    keys observed at least ``at_least`` times."""
    return {k: (min(v), len(v), v.count(min(v))) for k, v in sorted(observed.items()) if len(v) >= at_least}


def tightening(table: dict[LatencyKey, tuple[int, int, int]], family: str, fixed: dict[str, int],
               at_least: int) -> dict[tuple[str, str, str, str], int]:
    """Where ptxas shows a fixed-latency producer needs more than ``fixed`` (opcode -> cycles)
    allows: ``{(opcode, consumer category, role, slot): cycles}`` over the mnemonics of each
    opcode of ``family``, for the groups whose smallest distance exceeds the opcode's ``fixed``
    value and occurs exactly at least ``at_least`` times (a requirement ptxas packs to again and
    again, not slack)."""
    groups: dict[tuple[str, str, str, str], list[tuple[int, int]]] = {}
    for k, (least, _n, at_min) in table.items():
        if k.family == family:
            groups.setdefault((k.producer.split(".")[0], k.consumer, k.role, k.slot), []).append((least, at_min))
    out = {}
    for key, seen in groups.items():
        least = min(d for d, _ in seen)
        bound = fixed.get(key[0])
        if bound is not None and least > bound and sum(a for d, a in seen if d == least) >= at_least:
            out[key] = least
    return out
