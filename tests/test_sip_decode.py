"""Cubin reading and instruction decoding, checked against nvdisasm on every instruction of the
test cubins (tests/data/sip/, built by build.sh from the .cu files there and from the Triton
kernels in marssim/calibrate/sip/triton_kernels.py).

The nvdisasm output is parsed here with a separate, minimal parser so that the check does not
reuse the code under test."""

from __future__ import annotations

import re
import subprocess
from collections import defaultdict
from pathlib import Path

import pytest

from marssim.calibrate.sip import encoding
from marssim.calibrate.sip.cubin import parse_cubin, permute_text, read_cubin
from marssim.errors import InputError

DATA = Path(__file__).parent / "data" / "sip"
CUBINS = sorted(DATA.glob("*.cubin"))


def _nvdisasm():
    from marssim.calibrate.sip.sass import NvdisasmMissing, find_nvdisasm

    try:
        return find_nvdisasm()
    except NvdisasmMissing:
        return None


NVDISASM = _nvdisasm()
needs_nvdisasm = pytest.mark.skipif(NVDISASM is None, reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")

_LINE1 = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(.*?)\s*;\s*/\* 0x([0-9a-f]{16}) \*/")
_LINE2 = re.compile(r"^\s*/\* 0x([0-9a-f]{16}) \*/\s*$")


def nvdisasm_rows(path: Path) -> dict[str, list[tuple[int, str, int, int]]]:
    """kernel -> [(offset, text, low word, high word)] from `nvdisasm -c -hex`."""
    out = subprocess.run([NVDISASM, "-c", "-hex", str(path)], capture_output=True, text=True, check=True).stdout
    rows: dict[str, list] = defaultdict(list)
    kernel = None
    first = None
    for line in out.splitlines():
        m = re.match(r"^\s*\.section\s+\.text\.(\S+?),", line)
        if m:
            kernel = m.group(1)
            continue
        m = _LINE1.match(line)
        if m:
            first = (int(m.group(1), 16), m.group(2), int(m.group(3), 16))
            continue
        m = _LINE2.match(line)
        if m and first:
            rows[kernel].append((*first, int(m.group(1), 16)))
            first = None
    return rows


@pytest.fixture(scope="module")
def listings():
    """(path, kernel, rows) for every kernel of every test cubin."""
    out = []
    for path in CUBINS:
        for kernel, rows in nvdisasm_rows(path).items():
            out.append((path, kernel, rows))
    return out


def test_there_are_enough_real_kernels():
    kernels = {p.name.split(".")[0] for p in CUBINS}
    assert len(kernels) >= 3 and {"gemm_leaky_relu", "attention_fwd"} <= kernels
    assert {parse_cubin(p.read_bytes()).arch for p in CUBINS} >= {"sm_80", "sm_90", "sm_90a"}


@needs_nvdisasm
def test_words_match_nvdisasm_on_every_instruction(listings):
    total = 0
    for path, kernel, rows in listings:
        k = read_cubin(path).kernel(kernel)
        assert len(rows) == k.count, (path, kernel)
        for i, (offset, _text, lo, hi) in enumerate(rows):
            assert offset == 16 * i
            assert k.words[i] == (lo, hi), (path.name, kernel, hex(offset))
            total += 1
    assert total > 2500


@needs_nvdisasm
def test_guard_predicate_matches_text(listings):
    for path, kernel, rows in listings:
        for offset, text, lo, hi in rows:
            index, negated = encoding.guard_predicate(lo | hi << 64)
            m = re.match(r"@(!?)(U?)P([0-6T])\s", text)
            if m is None:
                assert (index, negated) == (7, False), (path.name, hex(offset), text)
            else:
                assert negated == (m.group(1) == "!"), text
                assert index == (7 if m.group(3) == "T" else int(m.group(3))), text


@needs_nvdisasm
def test_reuse_flags_match_text(listings):
    checked = 0
    for path, kernel, rows in listings:
        for offset, text, lo, hi in rows:
            word = lo | hi << 64
            marked = [255 if m.group(1) == "Z" else int(m.group(1))
                      for m in re.finditer(r"(?<![\w.])U?R(\d+|Z)\|?\.reuse", text)]
            slots = encoding.reuse_slots(word)
            assert len(slots) == len(marked), (path.name, hex(offset), text)
            fields = {encoding.register_field(word, f) for f in ("Ra", "Rb", "Rc")}
            assert set(marked) <= fields, (path.name, hex(offset), text)
            checked += bool(marked)
    assert checked > 100


@needs_nvdisasm
def test_destination_register_field_matches_text(listings):
    checked = 0
    for path, kernel, rows in listings:
        for offset, text, lo, hi in rows:
            body = re.sub(r"^@!?U?P[0-6T]\s+", "", text)
            parts = body.split(None, 1)
            if len(parts) < 2:
                continue
            first = parts[1].split(",")[0].strip()
            m = re.fullmatch(r"R(\d+|Z)", first)
            if m:
                want = 255 if m.group(1) == "Z" else int(m.group(1))
                assert encoding.register_field(lo | hi << 64, "Rd") == want, (path.name, hex(offset), text)
                checked += 1
    assert checked > 1500


@needs_nvdisasm
def test_opcode_field_names_one_mnemonic(listings):
    seen: dict[tuple[int, int], set[str]] = defaultdict(set)
    for path, kernel, rows in listings:
        sm = parse_cubin(path.read_bytes()).sm
        for offset, text, lo, hi in rows:
            mnemonic = re.sub(r"^@!?U?P[0-6T]\s+", "", text).split()[0].split(".")[0]
            seen[(sm, encoding.opcode_bits(lo))].add(mnemonic)
    clashes = {k: v for k, v in seen.items() if len(v) > 1}
    assert not clashes
    assert len(seen) > 60


@needs_nvdisasm
def test_control_codes_agree_with_latency_classes(listings):
    """Fixed-latency ALU operations never set a scoreboard; global loads whose register result
    is used always set a write scoreboard; DEPBAR waits on the scoreboard LDGDEPBAR sets."""
    alu = {"IADD3", "LOP3", "FFMA", "FMUL", "FADD", "ISETP", "FSETP", "SEL", "FSEL", "SHF", "LEA", "MOV",
           "IMAD", "UIADD3", "UMOV"}
    for path, kernel, rows in listings:
        ldgdepbar_sb = set()
        depbar_sb = set()
        for offset, text, lo, hi in rows:
            c = encoding.decode_control(lo | hi << 64)
            op = re.sub(r"^@!?U?P[0-6T]\s+", "", text).split()[0]
            base = op.split(".")[0]
            if base in alu:
                assert c.write_sb is None and c.read_sb is None, (path.name, hex(offset), text)
            if base == "LDG" and not text.split(",")[0].endswith("RZ"):
                assert c.write_sb is not None, (path.name, hex(offset), text)
            if base == "LDGDEPBAR":
                ldgdepbar_sb.add(c.write_sb)
            m = re.search(r"DEPBAR\.LE SB(\d)", text)
            if m:
                depbar_sb.add(int(m.group(1)))
            assert 0 <= c.stall <= 15 and 0 <= c.wait_mask < 64
        assert depbar_sb <= ldgdepbar_sb, (path.name, depbar_sb, ldgdepbar_sb)


@needs_nvdisasm
def test_arch_matches_nvdisasm_target():
    for path in CUBINS:
        out = subprocess.run([NVDISASM, "-c", str(path)], capture_output=True, text=True, check=True).stdout
        m = re.search(r"\.target\s+(sm_\w+)", out)
        # cubins in the older ELF layout (Triton's ptxas 12.9 for sm_80): nvdisasm states the target
        # only in the header flags (EF_CUDA_SM80)
        target = m.group(1) if m else "sm_" + re.search(r"EF_CUDA_SM(\d+)\b", out).group(1)
        assert read_cubin(path).arch == target, path.name


@needs_nvdisasm
def test_exit_offsets_from_nvinfo_point_at_exits(listings):
    n = 0
    for path, kernel, rows in listings:
        k = read_cubin(path).kernel(kernel)
        texts = {offset: text for offset, text, _, _ in rows}
        assert k.exit_offsets()
        for off in k.exit_offsets():
            assert re.sub(r"^@!?P[0-6T]\s+", "", texts[off]).startswith("EXIT"), (path.name, hex(off))
            assert off in k.pinned_offsets()
            n += 1
    assert n >= len(listings)


def test_kernel_parameter_layout_from_nvinfo():
    # saxpy_loop(int n, float a, const float *x, const float *y, float *out)
    k = read_cubin(DATA / "saxpy_loop.sm_90.cubin").kernel("saxpy_loop")
    assert [size for _, _, size in k.param_sizes()] == [4, 4, 8, 8, 8]
    assert [off for _, off, _ in k.param_sizes()] == [0, 4, 8, 16, 24]
    # Triton appends two hidden pointers (scratch buffers) to the 9 runtime arguments of the GEMM
    g = read_cubin(DATA / "gemm_leaky_relu.sm_90a.cubin").kernel()
    assert [size for _, _, size in g.param_sizes()] == [8, 8, 8] + [4] * 6 + [8, 8]


def test_permute_text_changes_only_the_section():
    cubin = read_cubin(DATA / "tiled_gemm.sm_90.cubin")
    k = cubin.kernel("tiled_gemm")
    order = list(range(k.count))
    order[3], order[4] = order[4], order[3]
    new = permute_text(cubin, "tiled_gemm", order)
    assert len(new) == len(cubin.data)
    diff = [i for i, (x, y) in enumerate(zip(new, cubin.data)) if x != y]
    assert diff and k.file_offset + 3 * 16 <= min(diff) and max(diff) < k.file_offset + 5 * 16
    again = parse_cubin(new).kernel("tiled_gemm")
    assert again.words[3] == k.words[4] and again.words[4] == k.words[3]
    assert permute_text(parse_cubin(new), "tiled_gemm", order) == cubin.data  # a swap is its own inverse
    with pytest.raises(ValueError):
        permute_text(cubin, "tiled_gemm", order[:-1])


def test_bad_cubins_raise_input_errors(tmp_path):
    bad = tmp_path / "x.cubin"
    bad.write_bytes(b"not an elf file at all")
    with pytest.raises(InputError, match="expected a cubin"):
        read_cubin(bad)
    with pytest.raises(InputError, match="cannot read"):
        read_cubin(tmp_path / "missing.cubin")
    cubin = read_cubin(DATA / "saxpy_loop.sm_90.cubin")
    with pytest.raises(InputError, match="expected one of saxpy_loop"):
        cubin.kernel("nope")


def test_control_fields_by_bit_position():
    # build a word by hand: stall 5, yield, write SB 2, read SB none, wait on SB 0 and 3, reuse Ra+Rc
    word = (5 << 105) | (1 << 109) | (2 << 110) | (7 << 113) | (0b001001 << 116) | (0b0101 << 122)
    c = encoding.decode_control(word)
    assert (c.stall, c.yield_, c.write_sb, c.read_sb) == (5, True, 2, None)
    assert c.waits == frozenset({0, 3}) and c.sets == frozenset({2})
    assert encoding.reuse_slots(word) == ("Ra", "Rc")
    assert c.describe() == "S05 Y W2 R- [0,3] reuse=ac"


@needs_nvdisasm
def test_a_cubin_with_two_kernels():
    from marssim.calibrate.sip.sass import disassemble

    cubin = read_cubin(DATA / "pair.sm_90.cubin")
    assert set(cubin.kernels) == {"saxpy_loop", "smem_reduce"}
    with pytest.raises(InputError, match="has 2 kernels"):
        cubin.kernel()
    listings = disassemble(cubin)
    alone = disassemble(read_cubin(DATA / "saxpy_loop.sm_90.cubin"))["saxpy_loop"]
    def norm(lst):  # label numbers run across the file
        return [re.sub(r"\.L_x_\d+", ".L", i.text) for i in lst.instructions]

    assert norm(listings["saxpy_loop"]) == norm(alone)
    # permuting one kernel leaves the other's bytes alone
    k = cubin.kernel("smem_reduce")
    other = cubin.kernel("saxpy_loop")
    order = list(range(k.count))
    order[1], order[2] = order[2], order[1]
    new = parse_cubin(permute_text(cubin, "smem_reduce", order))
    assert new.kernel("saxpy_loop").words == other.words and new.kernel("smem_reduce").words != k.words


@needs_nvdisasm
@pytest.mark.parametrize("name", ["tiled_gemm.sm_90.cubin", "smem_reduce.sm_80.cubin", "attention_fwd.sm_90a.cubin"])
def test_basic_blocks_partition_the_kernel_at_labels_and_control_flow(name):
    from marssim.calibrate.sip.sass import disassemble

    lst = next(iter(disassemble(read_cubin(DATA / name)).values()))
    blocks = lst.blocks
    assert blocks[0].start == 0 and blocks[-1].end == len(lst)
    assert all(a.end == b.start for a, b in zip(blocks, blocks[1:]))
    starts = {b.start for b in blocks}
    texts = [i.text for i in lst.instructions]
    label_at = {lab: i.index for i in lst.instructions for lab in i.labels}
    for i, text in enumerate(texts):
        for target in re.findall(r"`\(([^)]+)\)", text):  # every branch / BSSY target starts a block
            assert label_at[target] in starts
        op = re.sub(r"^@!?U?P[0-6T]\s+", "", text).split()[0].split(".")[0]
        if op in ("BRA", "EXIT", "BSSY", "BSYNC", "RET", "CALL") and i + 1 < len(texts):
            assert i + 1 in starts, (name, i, text)  # control flow ends its block
    for b in blocks:  # inside a block: no label, no control flow before the last slot
        for i in range(b.start + 1, b.end):
            assert not lst.instructions[i].labels
            assert not lst.instructions[i - 1].is_control_flow
