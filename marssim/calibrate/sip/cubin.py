"""Read a CUDA cubin (an ELF file) and rewrite its kernels' instruction order byte-exactly.

A cubin holds one ``.text.<kernel>`` section per kernel: a sequence of 128-bit instructions
(16 bytes each, little endian) on Volta and later. ``.nv.info.<kernel>`` holds attributes, some
of which list instruction offsets (EXIT instructions, S2R of CTA ids, ...), and
``.rel(a).text.<kernel>`` holds relocations that patch fields of given instructions at load
time. Instructions named by either must keep their offsets; :func:`pinned_offsets` lists them.

:func:`permute_text` writes a new cubin whose kernel ``.text`` section holds the same 16-byte
words in a new order; every other byte of the file is unchanged.
"""

from __future__ import annotations

import hashlib
import io
import struct
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from pathlib import Path

from marssim.errors import InputError

__all__ = ["Cubin", "Kernel", "NvInfoAttr", "read_cubin", "parse_cubin", "permute_text", "sha256",
           "INSTRUCTION_BYTES", "NVINFO_NAMES"]

INSTRUCTION_BYTES = 16

#: .nv.info attribute ids this module names (the subset that matters here). Names follow the
#: ones ``nvdisasm`` prints for the same ids.
NVINFO_NAMES = {
    0x04: "EIATTR_CTAIDZ_USED", 0x05: "EIATTR_MAX_THREADS", 0x0A: "EIATTR_PARAM_CBANK",
    0x10: "EIATTR_REQNTID", 0x11: "EIATTR_FRAME_SIZE", 0x12: "EIATTR_MIN_STACK_SIZE",
    0x17: "EIATTR_KPARAM_INFO", 0x19: "EIATTR_CBANK_PARAM_SIZE", 0x1B: "EIATTR_MAXREG_COUNT",
    0x1C: "EIATTR_EXIT_INSTR_OFFSETS", 0x1D: "EIATTR_S2RCTAID_INSTR_OFFSETS", 0x1E: "EIATTR_CRS_STACK_SIZE",
    0x23: "EIATTR_MAX_STACK_SIZE", 0x25: "EIATTR_LD_CACHEMOD_INSTR_OFFSETS",
    0x28: "EIATTR_COOP_GROUP_INSTR_OFFSETS", 0x29: "EIATTR_COOP_GROUP_MASK_REGIDS", 0x2F: "EIATTR_REGCOUNT",
    0x31: "EIATTR_INT_WARP_WIDE_INSTR_OFFSETS", 0x37: "EIATTR_CUDA_API_VERSION",
    0x4C: "EIATTR_NUM_BARRIERS", 0x50: "EIATTR_SPARSE_MMA_MASK", 0x66: "EIATTR_LANGUAGE",
    0x6D: "EIATTR_PREEXIT_USED",
}
#: attributes whose payload is a list of 32-bit instruction offsets
_OFFSET_LISTS = {0x1C, 0x1D, 0x25, 0x28, 0x31}
#: attributes whose payload is known to hold no instruction offset
_NOT_OFFSETS = {0x05, 0x0A, 0x10, 0x11, 0x12, 0x17, 0x19, 0x1B, 0x1E, 0x23, 0x29, 0x2F, 0x37, 0x4C, 0x50, 0x66}

_EIFMT_NVAL, _EIFMT_BVAL, _EIFMT_HVAL, _EIFMT_SVAL = 1, 2, 3, 4


@dataclass(frozen=True, slots=True)
class NvInfoAttr:
    """One ``.nv.info`` entry: format code, attribute id and payload bytes (for SVAL entries the
    data, for HVAL the 16-bit value's two bytes, for BVAL one byte, for NVAL none)."""

    fmt: int
    attr: int
    payload: bytes

    @property
    def name(self) -> str:
        """The attribute's EIATTR name, or ``EIATTR_0x..`` when this module does not know it."""
        return NVINFO_NAMES.get(self.attr, f"EIATTR_0x{self.attr:02x}")

    def words(self) -> tuple[int, ...]:
        """The payload as little-endian 32-bit words (a trailing partial word is dropped)."""
        n = len(self.payload) // 4
        return struct.unpack_from(f"<{n}I", self.payload) if n else ()


@dataclass(frozen=True)
class Kernel:
    """One kernel of a cubin: its name, the file offset and size of its ``.text`` section, the
    instruction words (pairs of 64-bit little-endian halves: ``lo`` holds bits 0-63, ``hi``
    bits 64-127), its ``.nv.info`` attributes and the byte offsets (inside ``.text``) that
    relocations patch."""

    name: str
    section: str
    file_offset: int
    size: int
    words: tuple[tuple[int, int], ...]
    nvinfo: tuple[NvInfoAttr, ...]
    relocation_offsets: tuple[int, ...]

    @property
    def count(self) -> int:
        """Number of 128-bit instructions."""
        return len(self.words)

    def word(self, index: int) -> int:
        """Instruction ``index`` as one 128-bit integer (bit i of the encoding is bit i here)."""
        lo, hi = self.words[index]
        return lo | (hi << 64)

    def pinned_offsets(self) -> frozenset[int]:
        """Byte offsets of instructions that must not move: those a relocation patches and those
        listed by an offset-carrying ``.nv.info`` attribute. Attributes this module does not know
        are read conservatively: each 16-byte-aligned 32-bit word inside ``.text`` pins."""
        pins = {off - off % INSTRUCTION_BYTES for off in self.relocation_offsets}
        for attr in self.nvinfo:
            if attr.fmt != _EIFMT_SVAL or attr.attr in _NOT_OFFSETS:
                continue
            for value in attr.words():
                if attr.attr in _OFFSET_LISTS or (value % INSTRUCTION_BYTES == 0 and value < self.size):
                    pins.add(value)
        return frozenset(pins)

    def exit_offsets(self) -> tuple[int, ...]:
        """Offsets listed by EIATTR_EXIT_INSTR_OFFSETS."""
        return tuple(v for a in self.nvinfo if a.attr == 0x1C for v in a.words())

    def param_sizes(self) -> tuple[tuple[int, int, int], ...]:
        """(ordinal, offset, size in bytes) of each kernel parameter from EIATTR_KPARAM_INFO,
        sorted by ordinal; the layout a launcher must follow."""
        params = []
        for attr in self.nvinfo:
            if attr.attr != 0x17 or len(attr.payload) < 12:
                continue
            _index, ordinal, offset, flags = struct.unpack_from("<IHHI", attr.payload)
            size = (flags >> 18) & 0x3FFF
            params.append((ordinal, offset, size))
        return tuple(sorted(params))


@dataclass(frozen=True)
class Cubin:
    """A parsed cubin: the raw bytes, the SM architecture from the ELF header (``90`` for
    sm_90/sm_90a, ``80`` for sm_80) with the arch-specific suffix, and its kernels."""

    data: bytes
    sm: int
    arch: str
    kernels: dict[str, Kernel]
    path: str | None = None

    @property
    def sha256(self) -> str:
        """Hex SHA-256 of the file's bytes."""
        return sha256(self.data)

    def kernel(self, name: str | None = None) -> Kernel:
        """The kernel ``name``; without a name, the only kernel (an :class:`InputError` if there
        are several or none)."""
        if name is None:
            if len(self.kernels) != 1:
                raise InputError(self.path, "--kernel-name",
                                 f"the cubin has {len(self.kernels)} kernels ({', '.join(self.kernels)}); name one")
            return next(iter(self.kernels.values()))
        try:
            return self.kernels[name]
        except KeyError:
            raise InputError(self.path, "--kernel-name",
                             f"expected one of {', '.join(self.kernels)}, got {name!r}") from None


def sha256(data: bytes) -> str:
    """Hex SHA-256 of ``data``."""
    return hashlib.sha256(data).hexdigest()


def _parse_nvinfo(data: bytes) -> tuple[NvInfoAttr, ...]:
    out = []
    pos = 0
    while pos + 2 <= len(data):
        fmt, attr = data[pos], data[pos + 1]
        pos += 2
        if fmt == _EIFMT_SVAL:
            (size,) = struct.unpack_from("<H", data, pos)
            pos += 2
            out.append(NvInfoAttr(fmt, attr, bytes(data[pos:pos + size])))
            pos += size
        elif fmt in (_EIFMT_HVAL, _EIFMT_NVAL, _EIFMT_BVAL):
            out.append(NvInfoAttr(fmt, attr, bytes(data[pos:pos + 2]) if fmt != _EIFMT_NVAL else b""))
            pos += 2
        else:
            raise ValueError(f"unknown .nv.info entry format {fmt} at byte {pos - 2}")
    return tuple(out)


def parse_cubin(data: bytes, path: str | None = None) -> Cubin:
    """Parse cubin bytes. Raises :class:`InputError` when the bytes are not a CUDA ELF file or a
    ``.text`` section is not a whole number of 128-bit instructions (pre-Volta encodings)."""
    from elftools.common.exceptions import ELFError
    from elftools.elf.elffile import ELFFile
    from elftools.elf.relocation import RelocationSection

    try:
        elf = ELFFile(io.BytesIO(data))
        machine = elf["e_machine"]
        flags = elf["e_flags"]
    except (ELFError, struct.error, ValueError) as err:
        raise InputError(path, "", f"expected a cubin (CUDA ELF file): {err}") from None
    if machine not in ("EM_CUDA", 190):
        raise InputError(path, "", f"expected a CUDA ELF file (e_machine EM_CUDA), got {machine}")
    abi = elf["e_ident"]["EI_ABIVERSION"]
    # CUDA ELF e_flags: the SM number sits in bits 8-15 (ABI v8+) or 0-7 (older).
    sm = (flags >> 8) & 0xFF if abi >= 8 else flags & 0xFF
    sections = {s.name: s for s in elf.iter_sections()}
    # The arch-specific variant (sm_90a) is marked in .nv.compat: a BVAL entry 0x09 with value 1.
    compat = sections.get(".nv.compat")
    arch_specific = False
    if compat is not None:
        try:
            entries = _parse_nvinfo(compat.data())
        except ValueError:  # trailing padding in some toolchains' .nv.compat
            entries = ()
        arch_specific = any(a.attr == 0x09 and a.payload[:1] == b"\x01" for a in entries)
    arch = f"sm_{sm}{'a' if arch_specific else ''}"

    relocs: dict[str, list[int]] = {}
    for sec in elf.iter_sections():
        if isinstance(sec, RelocationSection) and sec["sh_info"]:
            target = elf.get_section(sec["sh_info"]).name
            relocs.setdefault(target, []).extend(int(r["r_offset"]) for r in sec.iter_relocations())
    kernels: dict[str, Kernel] = {}
    for name, sec in sections.items():
        if not name.startswith(".text.") or sec["sh_type"] != "SHT_PROGBITS":
            continue
        kname = name[len(".text."):]
        size = int(sec["sh_size"])
        if size % INSTRUCTION_BYTES:
            raise InputError(path, name, f"expected a multiple of {INSTRUCTION_BYTES} bytes of 128-bit "
                                         f"instructions (Volta or later), got {size}")
        offset = int(sec["sh_offset"])
        raw = data[offset:offset + size]
        words = tuple(struct.iter_unpack("<QQ", raw))
        info = sections.get(f".nv.info.{kname}")
        nvinfo = _parse_nvinfo(info.data()) if info is not None else ()
        kernels[kname] = Kernel(kname, name, offset, size, words, nvinfo, tuple(sorted(relocs.get(name, ()))))
    if not kernels:
        raise InputError(path, "", "the cubin holds no .text.<kernel> section")
    return Cubin(bytes(data), sm, arch, dict(sorted(kernels.items())), path)


def read_cubin(path: str | Path) -> Cubin:
    """Read and parse the cubin at ``path`` (an :class:`InputError` if missing or not a cubin)."""
    p = Path(path)
    try:
        data = p.read_bytes()
    except OSError as err:
        raise InputError(str(path), "", f"cannot read the cubin: {err.strerror}") from None
    return parse_cubin(data, str(path))


#: bits 122-125 of an instruction (the operand-reuse flags) are bits 2-5 of its last byte
REUSE_BYTE_MASK = 0x3C


def permute_text(cubin: Cubin, kernel: str, order: Sequence[int], clear_reuse: Collection[int] = ()) -> bytes:
    """The cubin's bytes with kernel ``kernel``'s instructions reordered: slot ``i`` of the new
    ``.text`` holds the instruction that was at slot ``order[i]``, with the operand-reuse flags
    (bits 122-125) cleared on the instructions whose original index is in ``clear_reuse``.
    ``order`` must be a permutation of ``range(count)``; every byte outside the section is
    unchanged."""
    k = cubin.kernel(kernel)
    if sorted(order) != list(range(k.count)):
        raise ValueError(f"order is not a permutation of the {k.count} instructions of {kernel}")
    start = k.file_offset
    old = cubin.data[start:start + k.size]
    words = []
    for i in order:
        word = old[i * INSTRUCTION_BYTES:(i + 1) * INSTRUCTION_BYTES]
        if i in clear_reuse:
            word = word[:-1] + bytes([word[-1] & ~REUSE_BYTE_MASK & 0xFF])
        words.append(word)
    return cubin.data[:start] + b"".join(words) + cubin.data[start + k.size:]
