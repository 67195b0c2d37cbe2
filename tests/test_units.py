"""Unit strings against hand-computed SI values, and the errors for values of the wrong kind."""

from __future__ import annotations

import math

import pytest

from marssim import units
from marssim.units import UnitError, fmt_bytes, fmt_rate, fmt_time, parse


@pytest.mark.parametrize("text,kind,expected", [
    ("400 GB/s", "bandwidth", 400e9),
    ("3.35 TB/s", "bandwidth", 3.35e12),
    ("15.75 GB/s", "bandwidth", 15.75e9),
    ("100 Gb/s", "bandwidth", 12.5e9),            # bits: 100e9 / 8
    ("25 Gbps", "bandwidth", 3.125e9),
    ("400 Gbit/s", "bandwidth", 50e9),
    ("1 GiB/s", "bandwidth", 1073741824.0),       # 2**30
    ("96 GiB", "bytes", 103079215104.0),          # 96 * 2**30
    ("752 KiB", "bytes", 770048.0),               # 752 * 1024
    ("50 MiB", "bytes", 52428800.0),
    ("80 GB", "bytes", 80e9),
    ("1 kB", "bytes", 1000.0),
    ("8 b", "bytes", 1.0),
    ("1.5 us", "time", 1.5e-6),
    ("1.5us", "time", 1.5e-6),
    ("3 \u00b5s", "time", 3e-6),                  # micro sign
    ("3 \u03bcs", "time", 3e-6),                  # Greek small letter mu
    ("170 ns", "time", 1.7e-7),
    ("2 ms", "time", 2e-3),
    ("10 sec", "time", 10.0),
    ("0 s", "time", 0.0),
    ("1.83 GHz", "frequency", 1.83e9),
    ("1050 MHz", "frequency", 1.05e9),
    ("0.2 pJ", "energy", 2e-13),
    ("162.5 pJ", "energy", 1.625e-10),
    ("1 kJ", "energy", 1e3),
    ("700 W", "power", 700.0),
    ("1.2 kW", "power", 1200.0),
    ("5 mW", "power", 5e-3),
    ("989.4 TFLOP/s", "flop_rate", 9.894e14),
    ("2 TFLOPS", "flop_rate", 2e12),
    ("1979 TOP/s", "flop_rate", 1.979e15),
    ("4.089 GFLOP", "flops", 4.089e9),
    ("1e9", "bandwidth", 1e9),                    # a bare number is SI
    ("  64 GB/s  ", "bandwidth", 64e9),
])
def test_unit_strings_give_si_values(text: str, kind: units.Kind, expected: float) -> None:
    assert math.isclose(parse(text, kind, allow_zero=True), expected, rel_tol=1e-12)


@pytest.mark.parametrize("value,expected", [(5, 5.0), (2.5e9, 2.5e9), (1, 1.0)])
def test_bare_numbers_are_si(value: float, expected: float) -> None:
    assert parse(value, "bandwidth") == expected


@pytest.mark.parametrize("value,kind,words", [
    ("fast", "bandwidth", 'expected a bandwidth like "400 GB/s", got \'fast\''),
    ("2 GHz", "bandwidth", "(a frequency)"),
    ("400 GB/s", "frequency", "(a bandwidth)"),
    ("1 us", "bytes", "(a time)"),
    ("4 GiGa", "bytes", "unknown unit 'GiGa'"),
    ("1 mB", "bytes", "unknown unit 'mB'"),        # no milli-bytes
    ("1 Ms", "time", "unknown unit 'Ms'"),          # no mega-seconds
    ("-25 GB/s", "bandwidth", "that is positive"),
    ("0 GB/s", "bandwidth", "that is positive"),
    ("-1 ns", "time", "that is non-negative"),
    (float("nan"), "time", "non-negative"),
    (float("inf"), "bandwidth", "positive"),
    (True, "bandwidth", "got True"),
    (None, "bandwidth", "got None"),
    ([1], "bytes", "got [1]"),
    ("5 cycle", "time", "(a cycles)"),
])
def test_bad_values_name_what_was_expected(value: object, kind: units.Kind, words: str) -> None:
    with pytest.raises(UnitError) as info:
        parse(value, kind, allow_zero=kind == "time")
    assert words in str(info.value)
    assert str(info.value).startswith("expected a ")


def test_zero_only_where_allowed() -> None:
    assert parse("0 ns", "time", allow_zero=True) == 0.0
    with pytest.raises(UnitError):
        parse("0 ns", "time")


@pytest.mark.parametrize("fn,value,text", [
    (fmt_bytes, 3 * 2**30, "3 GiB"),
    (fmt_bytes, 752 * 2**10, "752 KiB"),
    (fmt_bytes, 512, "512 B"),
    (fmt_rate, 450e9, "450 GB/s"),
    (fmt_rate, 3.35e12, "3.35 TB/s"),
    (fmt_time, 1.5e-6, "1.5 us"),
    (fmt_time, 4.7e-7, "470 ns"),
    (fmt_time, 12.3e-3, "12.3 ms"),
    (fmt_time, 0.0, "0 s"),
])
def test_formatting_is_readable(fn, value: float, text: str) -> None:
    assert fn(value) == text


@pytest.mark.parametrize("value", [1.0, 999.0, 1536.0, 7.5e9, 2**40 * 1.7, 123456789.0])
def test_formatted_values_parse_back(value: float) -> None:
    # four significant digits are printed, so the round trip is within 0.05 %
    assert math.isclose(parse(fmt_bytes(value), "bytes"), value, rel_tol=5e-4)
    assert math.isclose(parse(fmt_rate(value), "bandwidth"), value, rel_tol=5e-4)
    assert math.isclose(parse(fmt_time(value * 1e-9), "time"), value * 1e-9, rel_tol=5e-4)


def test_atomic_files_get_the_usual_permissions(tmp_path):
    import os
    import stat

    from marssim.fsutil import atomic_file, staged_dir

    old = os.umask(0o022)
    try:
        with atomic_file(tmp_path / "a.txt") as fh:
            fh.write("x")
        with staged_dir(tmp_path / "out") as d:
            with atomic_file(d / "b.txt") as fh:
                fh.write("y")
        plain = tmp_path / "plain.txt"
        plain.write_text("z")
    finally:
        os.umask(old)
    expected = stat.S_IMODE(plain.stat().st_mode)  # what open() gives under the same umask
    assert stat.S_IMODE((tmp_path / "a.txt").stat().st_mode) == expected == 0o644
    assert stat.S_IMODE((tmp_path / "out" / "b.txt").stat().st_mode) == expected
