"""No long option of any verb may be abbreviated: ``--out`` given to a verb that only has
``--output`` is an unknown flag, never taken for the other one."""

import argparse

import pytest

from marssim.cli import build_parser, main


def _parsers(parser: argparse.ArgumentParser, path: str = "marssim"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from _parsers(child, f"{path} {name}")


def test_every_parser_refuses_abbreviations():
    found = list(_parsers(build_parser()))
    assert len(found) > 15  # the verbs and their sub-commands
    assert [path for path, p in found if p.allow_abbrev] == []


def test_prefix_of_a_long_option_is_unknown(capsys):
    # `compare` has --output (the table's path) but no --out: a prefix must not reach --output
    parser = build_parser()
    compare = dict(_parsers(parser))["marssim compare"]
    longs = {s for a in compare._actions for s in a.option_strings if s.startswith("--")}
    assert "--output" in longs and "--out" not in longs
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--system", "ring-8", "--workload", "mobilenetv2:batch=8", "--out", "x"])
    assert exc.value.code == 2
    assert "unrecognized arguments: --out" in capsys.readouterr().err
