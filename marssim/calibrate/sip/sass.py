"""SASS instructions as ``nvdisasm`` prints them, paired with their decoded 128-bit words.

:func:`disassemble` runs ``nvdisasm -c -hex`` on a cubin and returns, per kernel, a
:class:`Listing`: one :class:`Instruction` per 16-byte word with its text, guard, opcode,
modifiers, operands, the registers / predicates / uniform registers it reads and writes, its
memory access and its control code, plus the kernel's basic blocks. The printed hex words are
checked against the bytes read from the ELF file; a mismatch raises.

Register naming in ``reads`` / ``writes``: ``R5``, ``UR4``, ``P0``, ``UP1``. ``RZ``, ``URZ``,
``PT`` and ``UPT`` are constants and never appear. ``PR`` (all predicates) expands to P0-P6.
Where the width of an operand is uncertain the model over-approximates (a wider range), so
legality checks built on it err on the safe side.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

from marssim.errors import InputError

from .cubin import Cubin
from .encoding import Control, decode_control

__all__ = ["Instruction", "MemAccess", "Listing", "Block", "find_nvdisasm", "disassemble", "parse_listing",
           "parse_instruction", "NvdisasmMissing", "FENCE_OPCODES", "VARIABLE_LATENCY_OPCODES"]


class NvdisasmMissing(RuntimeError):
    """``nvdisasm`` was not found (install the ``nvidia-cuda-nvdisasm`` wheel or set $NVDISASM)."""


# ------------------------------------------------------------------ opcode classes
#: never move, and nothing moves across them: control flow, synchronisation, fences,
#: asynchronous-copy and warpgroup-MMA ordering, timers, and anything with side effects the
#: model does not describe.
FENCE_OPCODES = frozenset({
    "BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "CALL", "RET", "EXIT", "KILL", "BPT", "BREAK", "BSSY", "BSYNC",
    "BMOV", "WARPSYNC", "YIELD", "NANOSLEEP", "RPCMOV", "PREEXIT", "ACQBULK", "ENDCOLLECTIVE",
    "BAR", "BARRIER", "B2R", "R2B", "MEMBAR", "FENCE", "ERRBAR", "CCTL", "CCTLL", "CCTLT", "DEPBAR",
    "LDGDEPBAR", "ARRIVES", "SYNCS", "WARPGROUP", "HGMMA", "IGMMA", "QGMMA", "BGMMA", "UTMALDG", "UTMASTG",
    "UTMAPF", "UTMACCTL", "UTMACMDFLUSH", "UBLKCP", "UBLKRED", "UBLKPF", "UCGABAR_ARV", "UCGABAR_WAIT",
    "ELECT", "NOP", "SETCTAID", "SETLMEMBASE", "GETLMEMBASE", "LEPC", "VOTEU", "USETMAXREG", "ST_ASYNC",
    "RED_ASYNC", "STAS", "REDAS", "FENCE_VIEW", "CS2UR", "PMTRIG", "CSMTEST", "TEX", "TLD", "TLD4", "TMML",
    "TXD", "TXQ", "SUATOM", "SULD", "SURED", "SUST", "OUT", "PIXLD", "ISBERD", "AL2P", "ALD", "AST", "IPA",
})

#: operations whose result arrives after a variable delay (tracked by scoreboards, not stalls)
VARIABLE_LATENCY_OPCODES = frozenset({
    "LD", "LDG", "LDS", "LDL", "LDC", "LDSM", "LDGSTS", "ST", "STG", "STS", "STL", "ATOM", "ATOMG", "ATOMS",
    "RED", "REDG", "S2R", "S2UR", "MUFU", "I2F", "F2I", "F2F", "I2I", "FRND", "SHFL", "POPC", "FLO", "BREV",
    "MATCH", "REDUX", "DADD", "DMUL", "DFMA", "DSETP", "QSPC", "LDTRAM",
})

#: fixed-latency (stall-count protected) operations the model knows; anything neither here nor
#: in VARIABLE_LATENCY_OPCODES is treated as a fence
FIXED_LATENCY_OPCODES = frozenset({
    "IADD3", "IADD", "IMAD", "IMADSP", "IMUL", "LOP3", "LOP", "LEA", "SHF", "SHL", "SHR", "MOV", "MOV32I",
    "SEL", "FSEL", "ISETP", "FSETP", "HSETP2", "PSETP", "PLOP3", "P2R", "R2P", "CS2R", "IABS", "IMNMX",
    "VIMNMX", "VIMNMX3", "VIADD", "VIADDMNMX", "FMNMX", "FMNMX3", "FADD", "FADD32I", "FMUL", "FMUL32I",
    "FFMA", "FFMA32I", "FSWZADD", "HADD2", "HADD2_32I", "HMUL2", "HMUL2_32I", "HFMA2", "HFMA2_32I",
    "HMNMX2", "PRMT", "SGXT", "BMSK", "IDP", "IDP4A", "VABSDIFF", "VABSDIFF4", "FSET", "ISET", "HSET2",
    "FCHK", "IADD32I", "LOP32I", "ISCADD", "XMAD", "VOTE", "UIADD3", "UIMAD", "ULOP3", "ULOP", "ULOP32I",
    "ULEA", "USHF", "USEL", "UISETP", "UPLOP3", "UPSETP", "UMOV", "USGXT", "UPRMT", "UBMSK", "UFLO",
    "UPOPC", "UBREV", "UCLEA", "UIABS", "UIMNMX", "UP2UR", "UR2UP", "PLOP", "ULDC", "R2UR", "F2FP", "I2FP",
    "F2IP", "HMMA", "IMMA", "BMMA", "DMMA",
})

_PRED_ONLY_DST = frozenset({"ISETP", "FSETP", "DSETP", "HSETP2", "PSETP", "PLOP3", "FCHK", "UISETP",
                            "UPLOP3", "UPSETP", "PLOP"})
_NO_DST = frozenset({"ST", "STG", "STS", "STL", "RED", "REDG", "LDGSTS"})

_LOADS = {"LD": "generic", "LDG": "global", "LDS": "shared", "LDL": "local", "LDSM": "shared"}
_STORES = {"ST": "generic", "STG": "global", "STS": "shared", "STL": "local"}
_ATOMICS = {"ATOM": "generic", "ATOMG": "global", "ATOMS": "shared", "RED": "generic", "REDG": "global"}
_MMA = frozenset({"HMMA", "IMMA", "DMMA", "BMMA"})
_STRONG = frozenset({"STRONG", "VOLATILE", "MMIO", "SYS", "ACQUIRE", "RELEASE", "ACQ_REL", "MMIO"})

_TIMER_REGS = ("SR_CLOCKLO", "SR_CLOCKHI", "SR_GLOBALTIMERLO", "SR_GLOBALTIMERHI", "SR_CLOCK")


@dataclass(frozen=True, slots=True)
class MemAccess:
    """A memory access: ``space`` (global, shared, local, generic), ``kind`` (load, store,
    atomic; ``ldgsts`` = global load + shared store), ``strong`` for accesses with memory-model
    ordering qualifiers, ``cross_lane`` when a thread's data depends on other lanes' addresses
    (LDSM), the address expression without its immediate offset, the offset (bytes) and the
    access size (bytes per thread)."""

    space: str
    kind: str
    address: str
    offset: int
    size: int
    strong: bool = False
    cross_lane: bool = False

    @property
    def writes(self) -> bool:
        return self.kind in ("store", "atomic", "ldgsts")

    @property
    def reads(self) -> bool:
        return self.kind in ("load", "atomic", "ldgsts")

    def spaces_written(self) -> frozenset[str]:
        """Spaces this access writes (``ldgsts`` writes shared memory)."""
        if self.kind == "ldgsts":
            return frozenset({"shared"})
        return frozenset({self.space}) if self.writes else frozenset()

    def spaces_read(self) -> frozenset[str]:
        """Spaces this access reads (``ldgsts`` reads global memory)."""
        if self.kind == "ldgsts":
            return frozenset({"global"})
        return frozenset({self.space}) if self.reads else frozenset()


@dataclass(frozen=True)
class Instruction:
    """One SASS instruction with its decoded word and dependency footprint.

    ``index`` is its slot in the kernel's original order (offset = 16 * index). ``category`` is
    ``fence`` (never moves), ``memory``, ``variable`` (other scoreboard-tracked ops) or
    ``fixed`` (stall-count tracked ALU ops)."""

    index: int
    offset: int
    text: str
    guard: str | None
    opcode: str
    modifiers: tuple[str, ...]
    operands: tuple[str, ...]
    word: int
    control: Control
    reads: frozenset[str]
    writes: frozenset[str]
    mem: MemAccess | None
    category: str
    targets: tuple[str, ...] = ()
    labels: tuple[str, ...] = ()

    @property
    def mnemonic(self) -> str:
        """Opcode with modifiers, e.g. ``LDG.E.128``."""
        return ".".join((self.opcode,) + self.modifiers)

    @property
    def is_memory(self) -> bool:
        """A global, shared, local or generic load, store or atomic (SIP's movable class)."""
        return self.mem is not None

    @property
    def is_control_flow(self) -> bool:
        return self.opcode in _BLOCK_ENDERS


_BLOCK_ENDERS = frozenset({"BRA", "BRX", "BRXU", "JMP", "JMX", "JMXU", "CALL", "RET", "EXIT", "KILL", "BPT",
                           "BREAK", "BSSY", "BSYNC", "WARPSYNC"})


@dataclass(frozen=True, slots=True)
class Block:
    """A basic block: instructions ``start`` .. ``end - 1`` of the original order."""

    start: int
    end: int
    labels: tuple[str, ...] = ()

    def __len__(self) -> int:
        return self.end - self.start

    def __contains__(self, index: object) -> bool:
        return isinstance(index, int) and self.start <= index < self.end


@dataclass(frozen=True)
class Listing:
    """A kernel's instructions in original order and its basic blocks."""

    kernel: str
    arch: str
    instructions: tuple[Instruction, ...]
    blocks: tuple[Block, ...]
    pinned: frozenset[int] = field(default_factory=frozenset)

    def __len__(self) -> int:
        return len(self.instructions)

    def block_of(self) -> tuple[int, ...]:
        """Block number of each instruction (by original index)."""
        out = [0] * len(self.instructions)
        for b, block in enumerate(self.blocks):
            for i in range(block.start, block.end):
                out[i] = b
        return tuple(out)


# ------------------------------------------------------------------ nvdisasm
def find_nvdisasm() -> str:
    """Path of ``nvdisasm``: ``$NVDISASM``, then the ``nvidia-cuda-nvdisasm`` wheel, then PATH.
    Raises :class:`NvdisasmMissing` when none exists."""
    env = os.environ.get("NVDISASM")
    if env:
        if Path(env).is_file():
            return env
        raise NvdisasmMissing(f"$NVDISASM={env} is not a file")
    found = _wheel_nvdisasm()
    if found:
        return found
    on_path = shutil.which("nvdisasm")
    if on_path:
        return on_path
    raise NvdisasmMissing("nvdisasm not found: pip install nvidia-cuda-nvdisasm, or set $NVDISASM")


@lru_cache(maxsize=1)
def _wheel_nvdisasm() -> str | None:
    try:
        import nvidia
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for candidate in sorted(Path(root).glob("*/bin/nvdisasm")) + sorted(Path(root).glob("*/*/bin/nvdisasm")):
            if candidate.is_file() and os.access(candidate, os.X_OK):
                return str(candidate)
    return None


def nvdisasm_version() -> str:
    """First line of ``nvdisasm --version`` that names the release ("" if absent)."""
    try:
        out = subprocess.run([find_nvdisasm(), "--version"], capture_output=True, text=True, check=True).stdout
    except (NvdisasmMissing, OSError, subprocess.CalledProcessError):
        return ""
    lines = [ln for ln in out.splitlines() if "release" in ln or ln.startswith("Cuda compilation")]
    return lines[-1].strip() if lines else out.strip().splitlines()[-1]


def run_nvdisasm(data: bytes, *args: str) -> str:
    """Text output of ``nvdisasm ARGS`` on cubin bytes (written to a temporary file)."""
    import tempfile

    tool = find_nvdisasm()
    with tempfile.NamedTemporaryFile(suffix=".cubin") as tmp:
        tmp.write(data)
        tmp.flush()
        proc = subprocess.run([tool, *args, tmp.name], capture_output=True, text=True)
    if proc.returncode != 0:
        raise InputError(None, "nvdisasm", f"nvdisasm failed: {proc.stderr.strip() or proc.stdout.strip()}")
    return proc.stdout


def disassemble(cubin: Cubin, kernel: str | None = None) -> dict[str, Listing]:
    """Listings of the cubin's kernels (or of ``kernel`` only), from ``nvdisasm -c -hex``."""
    text = run_nvdisasm(cubin.data, "-c", "-hex")
    listings = parse_listing(text, cubin)
    if kernel is not None:
        cubin.kernel(kernel)
        return {kernel: listings[kernel]}
    return listings


_SECTION = re.compile(r"^\s*\.section\s+\.text\.([^,\s]+)\s*,")
_INSN = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/\s*$")
_HEX2 = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")
_LABEL = re.compile(r"^\s*(\.L_[\w.]+|[A-Za-z_$][\w.$]*):\s*$")


def parse_listing(text: str, cubin: Cubin) -> dict[str, Listing]:
    """Parse ``nvdisasm -c -hex`` output into listings, checking every printed word against the
    cubin's bytes (``ValueError`` on any difference or a missing instruction)."""
    raw: dict[str, list[tuple[int, str, int, tuple[str, ...]]]] = {}
    current: list | None = None
    pending_labels: list[str] = []
    half: tuple[int, str, int] | None = None
    for line in text.splitlines():
        m = _SECTION.match(line)
        if m:
            current = raw.setdefault(m.group(1), [])
            pending_labels = []
            continue
        if current is None:
            continue
        m = _INSN.match(line)
        if m:
            half = (int(m.group(1), 16), m.group(2), int(m.group(3), 16))
            continue
        m = _HEX2.match(line)
        if m and half is not None:
            offset, insn_text, lo = half
            current.append((offset, insn_text, lo | (int(m.group(1), 16) << 64), tuple(pending_labels)))
            pending_labels = []
            half = None
            continue
        m = _LABEL.match(line)
        if m and not m.group(1).startswith(".text."):
            pending_labels.append(m.group(1))
    out: dict[str, Listing] = {}
    for name, kernel in cubin.kernels.items():
        rows = raw.get(name)
        if rows is None or len(rows) != kernel.count:
            raise ValueError(f"nvdisasm printed {0 if rows is None else len(rows)} instructions for {name}, "
                             f"the ELF section holds {kernel.count}")
        insns = []
        for i, (offset, insn_text, word, labels) in enumerate(rows):
            if offset != 16 * i or word != kernel.word(i):
                raise ValueError(f"{name}: instruction {i} at {offset:#x}: nvdisasm word {word:#034x} differs "
                                 f"from the ELF word {kernel.word(i):#034x}")
            insns.append(parse_instruction(insn_text, word, i, labels))
        pinned = frozenset(o // 16 for o in kernel.pinned_offsets() if o < kernel.size)
        out[name] = Listing(name, cubin.arch, tuple(insns), find_blocks(insns), pinned)
    return out


# ------------------------------------------------------------------ one instruction
_GUARD = re.compile(r"^@(!?)(U?P(?:[0-6]|T))\s+")
_REG = re.compile(r"(?<![\w.])(U?R)(\d+|Z)\b")
_PRED = re.compile(r"(?<![\w.])(U?P)(\d|T|R)\b")
_TARGET = re.compile(r"`\(([^)]+)\)")
_NUM = re.compile(r"^[-+]?(0x[0-9a-fA-F]+|\d+)$")


def split_operands(text: str) -> tuple[str, ...]:
    """Split an operand list at top-level commas (commas inside [], {} or () stay)."""
    out: list[str] = []
    depth = 0
    cur = []
    for ch in text:
        if ch in "[{(":
            depth += 1
        elif ch in "]})":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    if "".join(cur).strip():
        out.append("".join(cur).strip())
    return tuple(out)


def _width_modifier(modifiers: Iterable[str]) -> int:
    """Registers per data operand implied by size modifiers (.64 -> 2, .128 -> 4)."""
    width = 1
    for m in modifiers:
        if m == "128":
            width = max(width, 4)
        elif m in ("64", "U64", "S64", "F64", "WIDE"):
            width = max(width, 2)
    return width


def _size_bytes(modifiers: Iterable[str]) -> int:
    size = 4
    for m in modifiers:
        if m == "128":
            size = 16
        elif m in ("64", "U64", "S64"):
            size = 8
        elif m in ("U8", "S8"):
            size = 1
        elif m in ("U16", "S16"):
            size = 2
    return size


def _expand(kind: str, number: str, width: int) -> list[str]:
    if number == "Z":
        return []
    n = int(number)
    return [f"{kind}{n + k}" for k in range(width)]


def _operand_regs(operand: str, width: int) -> list[str]:
    """Registers named in one operand. Inside an address ``[...]``, ``Rn.64`` spans 2 registers;
    ``desc[URn]`` and ``gdesc[URn]`` span 2 uniform registers; elsewhere ``width`` applies to
    plain register operands (R and UR)."""
    regs: list[str] = []
    if "[" in operand:
        for m in re.finditer(r"(?<![\w.])(U?R)(\d+|Z)(\.64)?", operand):
            w = 2 if m.group(3) else 1
            regs += _expand(m.group(1), m.group(2), w)
        for m in re.finditer(r"g?desc\[(U?R)(\d+|Z)\]", operand):
            regs += _expand(m.group(1), m.group(2), 2)
        return regs
    for m in _REG.finditer(operand):
        regs += _expand(m.group(1), m.group(2), width)
    return regs


def _operand_preds(operand: str) -> list[str]:
    out = []
    for m in _PRED.finditer(operand):
        kind, name = m.group(1), m.group(2)
        if name == "T":
            continue
        if name == "R":
            out += [f"{kind}{i}" for i in range(7)]
        else:
            out.append(f"{kind}{name}")
    return out


def _is_pred(operand: str) -> bool:
    return bool(re.fullmatch(r"!?U?P(\d|T|R)", operand))


def _is_reg(operand: str) -> bool:
    return bool(re.fullmatch(r"[-|!~]*U?R(\d+|Z)(\.\w+)*\|?(\.\w+)*", operand))


def _memory(opcode: str, modifiers: tuple[str, ...], operands: tuple[str, ...]) -> MemAccess | None:
    strong = any(m in _STRONG for m in modifiers) and "CONSTANT" not in modifiers
    if opcode == "LDGSTS":
        addr = next((o for o in operands if o.startswith("[")), "")
        key, off = _address_key(addr)
        return MemAccess("shared", "ldgsts", key, off, _size_bytes(modifiers), strong)
    for table, kind in ((_LOADS, "load"), (_STORES, "store"), (_ATOMICS, "atomic")):
        if opcode in table:
            addr = next((o for o in operands if "[" in o), "")
            key, off = _address_key(addr)
            return MemAccess(table[opcode], kind, key, off, _size_bytes(modifiers), strong, opcode == "LDSM")
    return None


def _address_key(operand: str) -> tuple[str, int]:
    """(address expression without the immediate offset, offset in bytes) of ``[...]``."""
    inner = operand[operand.rfind("[") + 1:operand.rfind("]")] if "[" in operand else operand
    prefix = operand[:operand.rfind("[")] if "[" in operand else ""
    terms = [t for t in re.split(r"(?=[+-])", inner.replace(" ", "")) if t]
    offset = 0
    rest = []
    for t in terms:
        body = t.lstrip("+")
        if _NUM.match(body):
            offset += int(body, 0)
        else:
            rest.append(t.lstrip("+"))
    return prefix + "[" + "+".join(rest) + "]", offset


def parse_instruction(text: str, word: int, index: int = 0, labels: tuple[str, ...] = ()) -> Instruction:
    """Build an :class:`Instruction` from ``nvdisasm`` text (without the ``;``) and its word."""
    body = text.strip().rstrip(";").strip()
    guard = None
    reads: set[str] = set()
    writes: set[str] = set()
    m = _GUARD.match(body)
    if m:
        guard = m.group(0).strip()
        body = body[m.end():]
        if m.group(2) not in ("PT", "UPT"):
            reads.add(m.group(2))
    head, _, rest = body.partition(" ")
    parts = head.split(".")
    opcode, modifiers = parts[0], tuple(parts[1:])
    operands = split_operands(rest.strip())
    targets = tuple(t for o in operands for t in _TARGET.findall(o))
    control = decode_control(word)
    mem = _memory(opcode, modifiers, operands)

    if opcode in FENCE_OPCODES or opcode not in (VARIABLE_LATENCY_OPCODES | FIXED_LATENCY_OPCODES) \
            or any(t in rest for t in _TIMER_REGS) or (mem is not None and mem.strong):
        category = "fence"
    elif mem is not None:
        category = "memory"
    elif opcode in VARIABLE_LATENCY_OPCODES or control.write_sb is not None or control.read_sb is not None:
        category = "variable"
    else:
        category = "fixed"

    width = _width_modifier(modifiers)
    if opcode.startswith("D") and opcode in ("DADD", "DMUL", "DFMA", "DSETP", "DMMA"):
        width = max(width, 2)
    if opcode in _MMA:
        width = 4
    data_width = width
    dst_width = width
    if opcode == "CS2R" and "32" not in modifiers:
        dst_width = 2
    if opcode == "LDSM":
        count = next((int(m) for m in modifiers if m in ("1", "2", "4")), 4)
        dst_width = count
    if opcode in ("IMAD", "UIMAD") and "WIDE" in modifiers:
        dst_width, data_width = 2, 1

    # destinations
    written_ops: set[int] = set()
    if opcode == "P2R":  # P2R Rd, PR, Rx, mask: reads the predicates, writes one register
        if operands and _is_reg(operands[0]):
            writes.update(_operand_regs(operands[0], 1))
            written_ops.add(0)
    elif opcode == "R2P":  # R2P PR, Rx, mask: writes predicates
        writes.update(f"P{i}" for i in range(7))
    elif opcode in _PRED_ONLY_DST:
        for i, op in enumerate(operands):
            if not _is_pred(op):
                break
            writes.update(_operand_preds(op))
    elif opcode not in _NO_DST and category != "fence":
        i = 0
        while i < len(operands) and _is_pred(operands[i]):  # e.g. SHFL PT, R3, ... / LOP3 P0, R3, ...
            writes.update(_operand_preds(operands[i]))
            i += 1
        if i < len(operands) and _is_reg(operands[i]):
            writes.update(_operand_regs(operands[i], dst_width))
            written_ops.add(i)
            i += 1
            while i < len(operands) and _is_pred(operands[i]):  # carry-out predicates, VOTE's PT
                writes.update(_operand_preds(operands[i]))
                i += 1

    # sources: every register operand that is not the destination, every predicate (written ones
    # too, to stay conservative)
    for i, op in enumerate(operands):
        preds = _operand_preds(op)
        reads.update(preds)
        if i in written_ops:
            continue
        w = data_width
        if opcode in ("IMAD", "UIMAD") and "WIDE" in modifiers and i == 3:
            w = 2  # the addend of IMAD.WIDE is 64-bit
        if mem is not None and "[" not in op and (mem.writes and opcode not in ("LDGSTS",)):
            w = _width_modifier(modifiers)  # store / atomic data
        reads.update(_operand_regs(op, w))

    return Instruction(index=index, offset=16 * index, text=text.strip(), guard=guard, opcode=opcode,
                       modifiers=modifiers, operands=operands, word=word, control=control,
                       reads=frozenset(reads), writes=frozenset(writes), mem=mem, category=category,
                       targets=targets, labels=labels)


# ------------------------------------------------------------------ basic blocks
def find_blocks(insns: list[Instruction] | tuple[Instruction, ...]) -> tuple[Block, ...]:
    """Basic blocks: a block starts at instruction 0, at every labelled instruction (a branch or
    reconvergence target) and after every control-flow instruction (BRA, EXIT, BSSY, BSYNC, ...,
    predicated or not)."""
    n = len(insns)
    leaders = {0}
    label_at = {label: i.index for i in insns for label in i.labels}
    for ins in insns:
        if ins.labels:
            leaders.add(ins.index)
        if ins.is_control_flow and ins.index + 1 < n:
            leaders.add(ins.index + 1)
        for t in ins.targets:
            if t in label_at:
                leaders.add(label_at[t])
    starts = sorted(x for x in leaders if x < n)
    blocks = []
    for k, s in enumerate(starts):
        e = starts[k + 1] if k + 1 < len(starts) else n
        blocks.append(Block(s, e, insns[s].labels))
    return tuple(blocks)
