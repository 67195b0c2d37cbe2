"""Every name an analysis script imports from marssim exists: the scripts import inside their
functions (and in child-process source strings), so a module moved or a name renamed would
otherwise only show when a benchmark is next run."""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ANALYSIS = Path(__file__).resolve().parent.parent / "analysis"
_FROM = re.compile(r"^\s*from (marssim[\w.]*) import ([\w ,]+)$", re.MULTILINE)


def _imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from marssim... import name`` in the script's code and in its
    string literals (the source a benchmark runs in a child process)."""
    text = path.read_text(encoding="utf-8")
    tree = ast.parse(text)
    found = [(node.module, alias.name) for node in ast.walk(tree)
             if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("marssim")
             for alias in node.names]
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for module, names in _FROM.findall(node.value):
                found += [(module, n.strip().split(" as ")[0]) for n in names.split(",") if n.strip()]
    return found


@pytest.mark.parametrize("script", sorted(ANALYSIS.glob("*.py")), ids=lambda p: p.name)
def test_every_marssim_name_an_analysis_script_imports_exists(script):
    for module, name in _imports(script):
        try:
            mod = importlib.import_module(module)
        except ImportError as e:  # an optional dependency the module needs (torch, triton)
            if (e.name or "").startswith("marssim"):
                raise AssertionError(f"{script.name}: no module {module}") from e
            continue
        if hasattr(mod, name):
            continue
        try:
            importlib.import_module(f"{module}.{name}")
        except ImportError as e:
            if (e.name or "").startswith("marssim"):
                raise AssertionError(f"{script.name}: {module} has no {name}") from e
