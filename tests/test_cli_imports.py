"""The command line imports only what a verb needs: ``--version`` and ``--help`` load none of the
heavy libraries nor the simulator or the cost model, and the static table of verbs names exactly
the verb modules present, with the help each registers."""

from __future__ import annotations

import argparse
import importlib
import json
import os
import pkgutil
import subprocess
import sys
from pathlib import Path

import marssim.cli as cli

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("pandas", "matplotlib", "scipy", "pydantic", "numpy", "networkx", "simpy", "numba",
         "marssim.sim", "marssim.cost", "marssim.system", "marssim.workload", "marssim.parallel")

_PROBE = """
import contextlib, io, json, sys
from marssim.cli import main
with contextlib.redirect_stdout(io.StringIO()):
    try:
        main(sys.argv[1:])
    except SystemExit:
        pass
print(json.dumps(sorted(sys.modules)))
"""


def _modules_after(*argv: str) -> set[str]:
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", _PROBE, *argv], capture_output=True, text=True, env=env,
                          cwd=str(ROOT), check=True)
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


def _loaded_heavy(modules: set[str]) -> list[str]:
    return [name for name in HEAVY if name in modules]


def test_version_imports_no_heavy_module():
    modules = _modules_after("--version")
    assert "marssim.cli" in modules  # the probe ran the command line
    assert _loaded_heavy(modules) == []
    assert not [m for m in modules if m.startswith("marssim.cli.") and m != "marssim.cli"]


def test_help_imports_no_heavy_module_nor_any_verb():
    modules = _modules_after("--help")
    assert _loaded_heavy(modules) == []
    assert not [m for m in modules if m.startswith("marssim.cli.") and m != "marssim.cli"]


def test_a_verb_imports_only_its_own_module():
    modules = _modules_after("simulate", "--help")
    verbs = {m.rsplit(".", 1)[1] for m in modules if m.startswith("marssim.cli.") and not m.split(".")[-1][0] == "_"}
    assert verbs == {"simulate"}


def _verb_modules() -> dict[str, object]:
    found = {}
    for info in pkgutil.iter_modules(cli.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"marssim.cli.{info.name}")
        if hasattr(module, "register"):
            found[info.name] = module
    return found


def test_verb_table_matches_the_modules_present():
    modules = _verb_modules()
    assert {v.module for v in cli.VERBS} == set(modules)
    for verb in cli.VERBS:
        assert modules[verb.module].VERB == verb.name
    by_order = sorted(modules.values(), key=lambda m: (getattr(m, "ORDER", 100), m.__name__))
    assert [m.VERB for m in by_order] == [v.name for v in cli.VERBS]


def test_verb_table_help_is_what_each_module_registers():
    for verb in cli.VERBS:
        parser = argparse.ArgumentParser()
        sub = parser.add_subparsers()
        importlib.import_module(f"marssim.cli.{verb.module}").register(sub)
        (action,) = sub._choices_actions
        assert action.dest == verb.name
        assert action.help == verb.help


def test_top_level_help_lists_every_verb(capsys):
    try:
        cli.main(["--help"])
    except SystemExit as stop:
        assert stop.code == 0
    out = capsys.readouterr().out
    for verb in cli.VERBS:
        assert f"    {verb.name}" in out
