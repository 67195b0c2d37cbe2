"""A design's memory hierarchy in YAML (``buffers:``) and its energy table (``energy: {table:}``):
what they resolve to, the windows the cost model reads, and one clear error per bad value."""

from __future__ import annotations

import copy
import math

import pytest
import yaml

from marssim.cost.features import DesignParams
from marssim.errors import InputError
from marssim.system import Design, load_system, system_from_dict
from marssim.system.buffers import operand_windows
from marssim.system.energy_tables import sram_byte_energy

SYSTEM: dict = {
    "name": "b",
    "designs": {"d": {"dataflow": "ws", "pe_rows": 8, "pe_cols": 8, "clock": "1 GHz", "sram": "1 MiB",
                      "sram_bandwidth": "64 GB/s"}},
    "accelerators": [{"id": "acc0", "design": "d", "memory": {"capacity": "1 GiB", "bandwidth": "10 GB/s"}}],
    "hosts": [{"id": "host0", "dram": {"capacity": "1 GiB", "bandwidth": "10 GB/s"}}],
    "links": [{"between": ["host0", "acc0"], "bandwidth": "10 GB/s"}],
}


def _design(**fields) -> Design:
    spec = copy.deepcopy(SYSTEM)
    spec["designs"]["d"].update(fields)
    return system_from_dict(spec).designs["d"]


def test_sram_alone_is_one_shared_buffer_any_operand_may_half_fill():
    d = _design()
    assert d.buffers is None
    assert operand_windows(d.sram, d.buffers) == ((2.0**19,) * 3, (2.0**19,) * 3)
    p = DesignParams(d)
    assert p.double_buffered and not p.per_operand and not p.im2col and p.dram_latency == 0.0


def test_per_operand_buffers_give_sram_and_half_windows():
    d = _design(sram=None, buffers={"ifmap": "64 KiB", "filter": "32 KiB", "ofmap": "16 KiB", "dram_latency": "80 ns"})
    assert d.sram == (64 + 32 + 16) * 1024
    windows, resident = operand_windows(d.sram, d.buffers)
    assert windows == (32 * 1024, 16 * 1024, 8 * 1024)
    assert resident == (64 * 1024, 32 * 1024, 16 * 1024)  # a whole buffer keeps what fits in it
    assert DesignParams(d).dram_latency == pytest.approx(80e-9)
    single = _design(sram=None, buffers={"ifmap": "64 KiB", "filter": "32 KiB", "ofmap": "16 KiB",
                                         "double_buffered": False})
    assert operand_windows(single.sram, single.buffers)[0] == (64 * 1024, 32 * 1024, 16 * 1024)


def test_split_of_sram_and_the_scalesim_convention():
    d = _design(buffers={"split": {"ifmap": 0.5, "filter": 0.25, "ofmap": 0.25}})
    assert operand_windows(d.sram, d.buffers)[0] == (2.0**18, 2.0**17, 2.0**17)
    s = _design(sram=None, buffers={"ifmap": "64 KiB", "filter": "64 KiB", "ofmap": "64 KiB", "convention": "scalesim"})
    windows, resident = operand_windows(s.sram, s.buffers)
    assert resident == windows == (32 * 1024,) * 3  # SCALE-Sim keeps only its active half
    p = DesignParams(s)
    assert p.per_operand and p.im2col and p.write_through and p.fixed_order
    assert not DesignParams(_design(sram=None, buffers={"ifmap": "1 KiB", "filter": "1 KiB", "ofmap": "1 KiB", "convention": "scalesim",
                                                        "dram_channels": "shared"})).per_operand


@pytest.mark.parametrize("fields, key, words", [
    ({"buffers": {"ifmap": "64 KiB"}}, "designs.d.buffers", "all three buffers"),
    ({"buffers": {"split": {"ifmap": 0.6, "filter": 0.3, "ofmap": 0.3}}}, "designs.d.buffers.split", "sum to at most 1"),
    ({"buffers": {"split": {"ifmap": 0.5, "filter": 0.5}}}, "designs.d.buffers.split", "missing ofmap"),
    ({"buffers": {"ifmap": "1 MiB", "filter": "1 MiB", "ofmap": "1 MiB"}}, "designs.d", "exceed sram"),
    ({"buffers": {"dram_channels": "many"}}, "designs.d.buffers.dram_channels", "shared"),
    ({"buffers": {"ifmap": "fast", "filter": "1 KiB", "ofmap": "1 KiB"}}, "designs.d.buffers.ifmap", "bytes"),
    ({"energy": {"table": "nope"}}, "designs.d.energy.table", "horowitz-45nm-int8"),
])
def test_bad_buffers_and_energy_get_one_error_with_the_key(tmp_path, fields, key, words):
    spec = copy.deepcopy(SYSTEM)
    spec["designs"]["d"].update(fields)
    path = tmp_path / "b.yaml"
    path.write_text(yaml.safe_dump(spec))
    with pytest.raises(InputError) as err:
        load_system(path)
    text = str(err.value)
    assert key in text and words in text and str(path) in text


def test_energy_table_follows_horowitz_and_fields_override():
    """The SRAM fit passes through Horowitz's 8 KB and 32 KB points (10 and 20 pJ per 64-bit
    read) and is within 13% of his 1 MB point (100 pJ); explicit fields win over the table."""
    assert sram_byte_energy(8 * 1024) == pytest.approx(10e-12 / 8)
    assert sram_byte_energy(32 * 1024) == pytest.approx(20e-12 / 8)
    assert sram_byte_energy(1 << 20) / (100e-12 / 8) == pytest.approx(1.13, abs=0.01)
    d = _design(sram="32 KiB", energy={"table": "horowitz-45nm-int8", "dram_write_byte": "200 pJ"})
    e = d.energy
    assert e.mac == pytest.approx(0.3e-12) and e.per_byte == pytest.approx((2.5e-12, 2.5e-12, 162.5e-12, 200e-12))
    assert "Horowitz" in e.source
    split = _design(sram="1 MiB", buffers={"split": {"ifmap": 0.25, "filter": 0.5, "ofmap": 0.25}},
                    energy={"table": "horowitz-45nm-fp16"})
    assert split.energy.sram_read_byte == pytest.approx(sram_byte_energy(512 * 1024))  # the largest buffer


def test_shipped_systems_keep_loading_and_herald_splits_shidiannao():
    d = load_system("herald-soc").designs["shi32"]
    assert d.buffers.split == {"ifmap": 0.25, "filter": 0.5, "ofmap": 0.25}
    for name in ("os32", "ws32", "nvdla64", "shi32", "rs16x32"):
        assert load_system("mars-adaptive-16").designs[name].buffers is None
    assert math.isclose(operand_windows(4 * 2.0**20, None)[0][0], 2.0**21)


def test_a_per_byte_figure_beside_a_table_replaces_its_read_and_write_figures():
    """``sram_byte`` (or ``dram_byte``) written beside ``table`` is the figure for reads and
    writes alike; the table's other figures still apply."""
    d = _design(sram="32 KiB", energy={"table": "horowitz-45nm-int8", "sram_byte": "5 pJ"})
    assert d.energy.per_byte == pytest.approx((5e-12, 5e-12, 162.5e-12, 162.5e-12))
    assert d.energy.mac == pytest.approx(0.3e-12)
    both = _design(sram="32 KiB", energy={"table": "horowitz-45nm-int8", "dram_byte": "100 pJ",
                                          "dram_write_byte": "150 pJ"})
    assert both.energy.per_byte == pytest.approx((2.5e-12, 2.5e-12, 100e-12, 150e-12))
