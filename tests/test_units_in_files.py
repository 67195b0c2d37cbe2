"""Quantities in system files: every dimensioned value needs its unit (a bare number is refused,
and the message says what it would have meant), values that overflow or are implausibly large are
refused with the reason, and sizes (PE arrays, SMs, tiles, id ranges) have bounds. Python code
building designs directly passes SI numbers."""

from __future__ import annotations

import copy

import pytest
import yaml

from marssim.cli import main
from marssim.errors import InputError
from marssim.system import Design, load_system, shipped_systems, system_from_dict
from marssim.units import MAXIMA, UnitError, parse
from marssim.workload import load_workload

BASE: dict = {
    "name": "tiny",
    "designs": {"os16": {"dataflow": "os", "pe_rows": 16, "pe_cols": 16, "clock": "1 GHz", "sram": "1 MiB",
                         "sram_bandwidth": "64 GB/s"}},
    "accelerators": [{"id": "acc[0-1]", "design": "os16", "memory": {"capacity": "4 GiB", "bandwidth": "25 GB/s"}}],
    "hosts": [{"id": "host0", "dram": {"capacity": "64 GiB", "bandwidth": "51.2 GB/s"}}],
    "links": [{"pattern": "chain", "nodes": ["host0", "acc0", "acc1"], "bandwidth": "25 GB/s", "latency": "1 us"}],
}


def _with(path: tuple, value) -> dict:
    data = copy.deepcopy(BASE)
    node = data
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return data


def _problem(data: dict) -> tuple[str, str]:
    with pytest.raises(InputError) as info:
        system_from_dict(data, "sys.yaml")
    assert len(info.value.problems) == 1, info.value.problems
    return info.value.problems[0]


@pytest.mark.parametrize("path, value, unit", [
    (("links", 0, "bandwidth"), 25, "B/s"),
    (("links", 0, "latency"), 1e-6, "s"),
    (("designs", "os16", "clock"), 1e9, "Hz"),
    (("designs", "os16", "sram"), "1048576", "B"),  # a number written as a string has no unit either
    (("accelerators", 0, "memory", "capacity"), 4294967296, "B"),
])
def test_a_bare_number_is_refused_and_the_message_says_what_it_would_mean(path, value, unit):
    key, message = _problem(_with(path, value))
    assert key == ".".join(str(p) if not isinstance(p, int) else f"[{p}]" for p in path).replace(".[", "[")
    assert "bare number" in message and f'"{value} {unit}"' in message


def test_zero_needs_no_unit_and_si_numbers_from_python_are_taken_as_si():
    system = system_from_dict(_with(("links", 0, "latency"), 0), "sys.yaml")
    assert system.links[0].latency == 0.0
    design = Design(name="d", dataflow="os", pe_rows=8, pe_cols=8, clock=1e9, sram=2**20, sram_bandwidth=64e9)
    assert design.clock == 1e9 and design.sram_bandwidth == 64e9
    # dicts built by Python code may opt out explicitly
    lax = system_from_dict(_with(("links", 0, "bandwidth"), 25e9), "<python>", require_units=False)
    assert lax.links[0].bandwidth == 25e9


def test_every_shipped_system_gives_its_units():
    for path in shipped_systems():
        load_system(path)  # raises on a bare number


def test_a_value_that_overflows_is_called_an_overflow():
    key, message = _problem(_with(("links", 0, "bandwidth"), "1e308 GB/s"))
    assert key == "links[0].bandwidth" and "overflows a 64-bit float" in message and "not positive" not in message


@pytest.mark.parametrize("path, value, words", [
    (("designs", "os16", "pe_rows"), 99999999999999999999, "from 0 to 65,536 (a PE array dimension"),
    (("links", 0, "bandwidth"), "2 EB/s", "at most 1 EB/s"),
    (("designs", "os16", "clock"), "5 THz", "at most 1 THz"),
    (("accelerators", 0, "memory", "capacity"), "2 ZiB", "at most 1 ZiB"),
    (("accelerators", 0, "id"), "acc[0-99999999]", "expected at most 100,000"),
])
def test_implausible_sizes_are_refused_with_the_reason(path, value, words):
    key, message = _problem(_with(path, value))
    assert words in message
    assert key.split(".")[0].split("[")[0] == path[0]


def test_gpu_sizes_are_bounded_and_the_launch_overhead_takes_a_unit():
    spec = {"dataflow": "gpu", "clock": "1.8 GHz", "sram": "50 MiB", "sram_bandwidth": "10 TB/s",
            "gpu": {"sms": 132, "peak_flops": {"fp16": "989 TFLOP/s"}, "launch_overhead": "4 us"}}
    data = _with(("designs", "g"), spec)
    data["accelerators"][0]["design"] = "g"
    assert system_from_dict(data, "sys.yaml").designs["g"].gpu.launch_overhead == pytest.approx(4e-6)
    spec["gpu"]["sms"] = 10**6
    key, message = _problem(data)
    assert key == "designs.g.gpu.sms" and "streaming multiprocessors" in message


def test_the_bounds_are_applied_to_the_si_value():
    limit = MAXIMA["bandwidth"][0]
    assert parse(f"{limit / 1e9} GB/s", "bandwidth", bounded=True) == pytest.approx(limit)
    with pytest.raises(UnitError):
        parse(f"{limit * 1.01 / 1e9} GB/s", "bandwidth", bounded=True)
    assert parse("8 pJ/B", "energy_per_byte") == pytest.approx(8e-12)
    assert parse("1 pJ/bit", "energy_per_byte") == pytest.approx(8e-12)


def test_a_huge_workload_is_refused_before_its_counts_overflow():
    with pytest.raises(InputError) as info:
        load_workload("resnet50:batch=99999999999999999999")
    assert "64-bit integers" in str(info.value)


def test_the_cli_prints_the_unit_problem_on_one_line(tmp_path, capsys):
    path = tmp_path / "sys.yaml"
    path.write_text(yaml.safe_dump(_with(("links", 0, "bandwidth"), 25)))
    assert main(["show", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "links[0].bandwidth" in err and str(path) in err


def test_the_streams_per_device_are_bounded(capsys):
    with pytest.raises(SystemExit) as info:
        main(["simulate", "--system", "ring-8", "--workload", "resnet50:batch=2", "--streams", "1000000000"])
    assert info.value.code == 2 and "at most 1024 streams" in capsys.readouterr().err
