"""The command line: --help lists every verb; `systems` and `show` work on every shipped system."""

from __future__ import annotations

import importlib
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

import marssim.cli
from marssim.cli import main
from marssim.system import load_system, shipped_systems


def _verbs() -> list[str]:
    verbs = []
    for info in pkgutil.iter_modules(marssim.cli.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"marssim.cli.{info.name}")
        if hasattr(module, "register"):
            verbs.append(module.VERB)
    return verbs


def test_help_lists_every_verb() -> None:
    verbs = _verbs()
    assert {"systems", "show"} <= set(verbs)
    proc = subprocess.run([sys.executable, "-m", "marssim", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    listed = proc.stdout.split("verbs:")[1]
    for verb in verbs:
        shown = re.search(rf"^    {re.escape(verb)}(\s|$)", listed, re.MULTILINE)
        assert shown, f"{verb} missing from --help:\n{proc.stdout}"


@pytest.mark.parametrize("verb", _verbs())
def test_every_verb_has_its_own_help(verb: str, capsys) -> None:
    with pytest.raises(SystemExit) as info:
        main([verb, "--help"])
    assert info.value.code == 0
    assert f"usage: marssim {verb}" in capsys.readouterr().out


def test_no_verb_prints_help_and_exits_2(capsys) -> None:
    assert main([]) == 2
    assert "verbs:" in capsys.readouterr().out


def test_systems_lists_every_shipped_system(capsys) -> None:
    assert main(["systems"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip() and not line.startswith(" ")}
    for path in shipped_systems():
        system = load_system(path)
        assert path.stem in rows
        assert rows[path.stem].split()[1] == str(len(system.accelerators))
        assert all(d in rows[path.stem] for d in system.designs)


@pytest.mark.parametrize("path", shipped_systems(), ids=lambda p: p.stem)
def test_show_prints_each_shipped_system(path: Path, capsys) -> None:
    assert main(["show", path.stem]) == 0
    out = capsys.readouterr().out
    system = load_system(path)
    assert out.startswith(f"System {system.name}")
    for section in ("Designs", "Accelerators", "Hosts", "Links", "Example routes"):
        assert f"\n{section}" in out
    for name in system.designs:
        assert f"\n  {name} " in out
    # showing by path gives the same text
    assert main(["show", str(path)]) == 0
    assert capsys.readouterr().out == out


def test_show_unknown_spec_is_one_clear_error(capsys) -> None:
    assert main(["show", "no-such-thing"]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("marssim show: error: no-such-thing: no such file, shipped system or workload")
    assert "dgx-h100" in lines[0]


def test_systems_reports_a_broken_file_and_exits_2(tmp_path: Path, monkeypatch, capsys) -> None:
    good = next(p for p in shipped_systems() if p.stem == "ring-8")
    (tmp_path / "ring-8.yaml").write_text(good.read_text(encoding="utf-8"), encoding="utf-8")
    (tmp_path / "broken.yaml").write_text("name: broken\nlinks: [\n", encoding="utf-8")
    monkeypatch.setenv("MARSSIM_TOPOLOGIES", str(tmp_path))
    assert main(["systems"]) == 2
    captured = capsys.readouterr()
    assert "ring-8" in captured.out and "broken" in captured.out
    assert f"{tmp_path / 'broken.yaml'}: line " in captured.err
    assert "Traceback" not in captured.err


def test_a_closed_pipe_ends_quietly() -> None:
    # `marssim show resnet50 | head -1`: the reader leaves early; no traceback on stderr.
    proc = subprocess.Popen([sys.executable, "-m", "marssim", "show", "resnet50"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, bufsize=0)
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # before the command has printed anything: its first write fails
    err = proc.stderr.read().decode()
    proc.wait(timeout=60)
    assert "Traceback" not in err, err
