"""The package boundaries of docs/ARCHITECTURE.md, enforced: every import of every module of
marssim (read with ``ast``, lazy imports inside functions included) is checked against the
"must not know about" column of the package table, whose backticked names are the modules a row
may not import (``sim`` forbids ``marssim.sim`` and its submodules, ``sim.engine`` that module
alone, a name that is no module of marssim a third-party package such as ``simpy``)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "marssim"
DOC = ROOT / "docs" / "ARCHITECTURE.md"
EVERYTHING_ELSE = "everything else"


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def is_marssim_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return (ROOT / rel).with_suffix(".py").is_file() or (ROOT / rel / "__init__.py").is_file()


def imports_of(path: Path, module: str) -> set[str]:
    """Absolute names of every module ``path`` imports; ``from X import Y`` gives ``X`` and, when
    ``X.Y`` is a module of marssim, ``X.Y`` too."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            for alias in node.names:
                if is_marssim_module(f"{target}.{alias.name}"):
                    out.add(f"{target}.{alias.name}")
    return out


def owner_key(name: str) -> str:
    """How a row's first column names a module: ``units.py``, ``system/``, ``__init__.py``."""
    parts = name.split(".")[1:]
    if not parts:
        return "__init__.py"
    if len(parts) == 1 and not (PACKAGE / parts[0]).is_dir():
        return f"{parts[0]}.py"
    return f"{parts[0]}/"


def read_table() -> list[tuple[list[str], list[str], bool]]:
    """Rows of the package table: (modules the row owns, forbidden names, 'everything else')."""
    rows = []
    for line in DOC.read_text(encoding="utf-8").splitlines():
        if not line.startswith("| `"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        owners = re.findall(r"`([^`]+)`", cells[0])
        forbidden = re.findall(r"`([^`]+)`", cells[-1])
        rows.append((owners, forbidden, cells[-1].startswith(EVERYTHING_ELSE)))
    return rows


def forbidden_modules(names: list[str]) -> list[tuple[str, bool]]:
    """``(prefix, is marssim)`` per forbidden name."""
    return [(f"marssim.{n}", True) if is_marssim_module(f"marssim.{n}") else (n, False) for n in names]


def hits(imported: str, prefix: str) -> bool:
    return imported == prefix or imported.startswith(prefix + ".")


def test_the_table_covers_every_module_once():
    rows = read_table()
    assert len(rows) >= 15  # the table was found and read
    owners = [o for row in rows for o in row[0]]
    assert len(owners) == len(set(owners)), "a module is listed in two rows"
    unowned = sorted({owner_key(m) for m in all_modules()} - set(owners))
    assert not unowned, f"modules missing from the table in docs/ARCHITECTURE.md: {unowned}"
    for _, forbidden, _ in rows:
        for name in forbidden:
            # a forbidden name is a module of marssim or an importable third-party package
            assert is_marssim_module(f"marssim.{name}") or re.fullmatch(r"[a-z_][a-z0-9_]*", name), name


def violations() -> list[str]:
    rows = read_table()
    row_of = {o: row for row in rows for o in row[0]}
    found = []
    for module, path in all_modules().items():
        owners, forbidden, everything_else = row_of[owner_key(module)]
        rules = forbidden_modules(forbidden)
        own = {f"marssim.{o.rstrip('/').removesuffix('.py')}" for o in owners}
        for imported in sorted(imports_of(path, module)):
            if everything_else and hits(imported, "marssim") and imported != "marssim" \
                    and not any(hits(imported, o) for o in own):
                found.append(f"{module} imports {imported} (its row knows nothing else of marssim)")
            for prefix, _ in rules:
                if hits(imported, prefix):
                    found.append(f"{module} imports {imported}, which docs/ARCHITECTURE.md says it must not know")
    return found


def test_no_package_imports_what_it_must_not_know():
    assert violations() == []


def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch):
    """The checker itself: a module of ``workload/`` that imports the system is reported."""
    fake = tmp_path / "probe.py"
    fake.write_text("def f():\n    from marssim.system import load_system\n    from ..cost import base\n")
    module = "marssim.workload.probe"
    imported = imports_of(fake, module)
    assert "marssim.system" in imported and "marssim.cost" in imported and "marssim.cost.base" in imported
    rules = forbidden_modules(next(r for r in read_table() if "workload/" in r[0])[1])
    assert any(hits("marssim.system", prefix) for prefix, _ in rules)


@pytest.mark.parametrize("module, forbidden", [
    ("marssim.workload.describe", "marssim.system"),
    ("marssim.search.report", "marssim.trace"),
    ("marssim.validate.inputs", "marssim.search"),
])
def test_the_known_crossings_are_gone(module, forbidden):
    path = all_modules()[module]
    assert not any(hits(i, forbidden) for i in imports_of(path, module))


def component(name: str) -> str:
    """The package (or top-level module) of marssim a module belongs to: ``marssim.plan.run`` ->
    ``marssim.plan``, ``marssim.lower`` -> ``marssim.lower``."""
    return ".".join(name.split(".")[:2])


def package_imports() -> dict[str, set[str]]:
    """Per package of marssim, the other packages of marssim its modules import (lazy imports
    inside functions included)."""
    modules = all_modules()
    packages = {component(m) for m in modules}
    out: dict[str, set[str]] = {p: set() for p in packages}
    for module, path in modules.items():
        here = component(module)
        for imported in imports_of(path, module):
            there = component(imported)
            if there != here and there in packages:
                out[here].add(there)
    return out


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every group of packages that import one another in a circle (the strongly connected
    components of more than one package, Tarjan's algorithm), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(found)


def test_no_packages_import_each_other_in_a_circle():
    assert circles(package_imports()) == []


def test_the_circle_checker_sees_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_mapping_and_parallel_do_not_know_each_other():
    """A per-op mapping and a parallel configuration are two kinds of plan, each with its own
    lowering; the plan level above both is what knows them both."""
    graph = package_imports()
    assert "marssim.parallel" not in graph["marssim.mapping"]
    assert "marssim.mapping" not in graph["marssim.parallel"]
    assert {"marssim.mapping", "marssim.parallel"} <= graph["marssim.plan"]


PLAN_CLASSES = {"Mapping", "ParallelConfig", "Deployment"}
"""The classes of the kinds of plan (:mod:`marssim.plan.kinds`)."""
PLAN_KIND_CHECKS_ALLOWED: dict[str, int] = {}
"""Modules outside ``marssim.plan`` allowed to ask a plan its class, and how often (none: the
kinds are told apart by ``marssim.plan.kinds.kind_of``)."""


def plan_class_names(tree: ast.AST) -> set[str]:
    """The local names a module binds to a plan class of marssim (``from marssim.mapping import
    Mapping``, ``... import Deployment as D``); ``collections.abc.Mapping`` is none of them."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("marssim")):
            names.update(a.asname or a.name for a in node.names if a.name in PLAN_CLASSES)
    return names


def plan_kind_checks(path: Path) -> int:
    """``isinstance(x, C)`` (or with a tuple holding C) in ``path`` where C is a plan class
    imported from marssim, by name or as ``module.C``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    local = plan_class_names(tree)

    def names_plan(node: ast.AST) -> bool:
        if isinstance(node, ast.Tuple):
            return any(names_plan(e) for e in node.elts)
        if isinstance(node, ast.Name):
            return node.id in local
        return isinstance(node, ast.Attribute) and node.attr in PLAN_CLASSES

    return sum(1 for node in ast.walk(tree)
               if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "isinstance"
               and len(node.args) == 2 and names_plan(node.args[1]))


def test_the_counter_sees_a_plan_kind_check_and_not_an_abc(tmp_path):
    sample = tmp_path / "sample.py"
    sample.write_text("from collections.abc import Mapping\nfrom marssim.parallel import ParallelConfig as P\n"
                      "import marssim.serve.deployment as d\n"
                      "a = isinstance(x, Mapping)\nb = isinstance(x, (int, P))\nc = isinstance(x, d.Deployment)\n")
    assert plan_kind_checks(sample) == 2


def test_no_module_outside_the_plan_level_asks_a_plan_its_class():
    found = {}
    for module, path in all_modules().items():
        if module == "marssim.plan" or module.startswith("marssim.plan."):
            continue
        n = plan_kind_checks(path)
        if n != PLAN_KIND_CHECKS_ALLOWED.get(module, 0):
            found[module] = n
    assert not found, f"isinstance on a plan class outside marssim/plan (use marssim.plan.kinds.kind_of): {found}"


# ---------------------------------------------------------------------------- files of one package

PARALLEL = "marssim.parallel"
MAX_PARALLEL_LINES = 650

KNOWN_FILE_CIRCLES: dict[str, list[list[str]]] = {
    # packages whose files import one another in a circle at import time: none (nor through
    # imports inside functions, see test_no_files_of_a_package_import_each_other_even_lazily).
}

def _from_target(node: ast.ImportFrom, package: str) -> str:
    """The absolute module ``from X import ...`` names (relative imports resolved in ``package``)."""
    if not node.level:
        return node.module or ""
    base = package.split(".")
    base = base[:len(base) - node.level + 1]
    return ".".join(base + ([node.module] if node.module else []))


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def modules_imported(path: Path, module: str, inside_functions: bool = False) -> set[str]:
    """Absolute names of the modules ``module`` imports when it is imported (not in function
    bodies nor under ``if TYPE_CHECKING``; with ``inside_functions``, in function bodies too):
    ``from X import Y`` gives ``X.Y`` when that is a module of marssim, else ``X``."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) and not inside_functions:
                continue
            if _is_type_checking(child):
                for other in child.orelse:
                    visit(ast.Module(body=[other], type_ignores=[]))
                continue
            if isinstance(child, ast.Import):
                out.update(alias.name for alias in child.names)
            elif isinstance(child, ast.ImportFrom):
                target = _from_target(child, package)
                for alias in child.names:
                    sub = f"{target}.{alias.name}"
                    out.add(sub if is_marssim_module(sub) else target)
            else:
                visit(child)

    visit(tree)
    return out


def packages() -> list[str]:
    """Every package of marssim (``marssim`` itself included)."""
    return sorted({m for m, p in all_modules().items() if p.name == "__init__.py"})


def file_imports(package: str, inside_functions: bool = False) -> dict[str, set[str]]:
    """Per file of ``package`` (its ``__init__`` and its modules, not its subpackages' files), the
    other files of it that it imports (:func:`modules_imported`)."""
    files = {m: p for m, p in all_modules().items()
             if m == package or (m.rpartition(".")[0] == package and p.name != "__init__.py")}
    return {m: {i for i in modules_imported(p, m, inside_functions) if i in files and i != m}
            for m, p in files.items()}


def test_no_files_of_a_package_import_each_other_in_a_circle():
    """At import time, no file of a package imports another that (through others) imports it:
    each package's files form layers (the known circles of other packages aside)."""
    found = {p: c for p in packages() if (c := circles(file_imports(p)))}
    assert found == KNOWN_FILE_CIRCLES


def test_no_files_of_a_package_import_each_other_even_lazily():
    """Not even an import inside a function closes a circle between the files of a package: what
    two files share lives in a module both import, so each package's dependencies point one way
    (every package of marssim)."""
    found = {p: c for p in packages() if (c := circles(file_imports(p, inside_functions=True)))}
    assert found == {}
    assert "marssim.sim" in packages() and "marssim.parallel" in packages()  # the checker sees the packages


def test_parallel_model_never_reaches_back_to_the_lowering():
    """In ``parallel/`` the model of a run (partition, runmodel, memory) imports nothing of the
    lowering that reads it, not even inside a function."""
    graph = file_imports(PARALLEL, inside_functions=True)
    model = {f"{PARALLEL}.{m}" for m in ("memo", "partition", "runmodel", "memory")}
    lowering = {f"{PARALLEL}.{m}" for m in ("lower", "builder", "program", "template")}
    for module in model:
        assert not graph[module] & lowering, f"{module} imports the lowering: {sorted(graph[module] & lowering)}"


def test_the_file_circle_checker_sees_a_circle_at_import_time(tmp_path):
    """The checker itself: a module-level import counts, one inside a function or under
    ``TYPE_CHECKING`` only with ``inside_functions`` (or not at all)."""
    probe = tmp_path / "probe.py"
    probe.write_text("from typing import TYPE_CHECKING\nfrom .memo import graph_cached\n"
                     "from . import lower\nif TYPE_CHECKING:\n    from .report import ParallelReport\n"
                     "def f():\n    from .builder import Templates\n")
    module = f"{PARALLEL}.probe"
    top = modules_imported(probe, module)
    assert {f"{PARALLEL}.memo", f"{PARALLEL}.lower"} <= top
    assert f"{PARALLEL}.builder" not in top and f"{PARALLEL}.report" not in top
    assert PARALLEL not in top  # `from . import lower` imports the module, not the package's names
    assert f"{PARALLEL}.builder" in modules_imported(probe, module, inside_functions=True)


def test_the_file_circle_checker_sees_a_circle_through_a_lazy_import(tmp_path):
    """The checker itself, end to end: ``a`` imports ``b`` when imported and ``b`` imports ``a``
    inside a function; the circle is there with ``inside_functions`` and not without."""
    package = "marssim.probe"
    paths = {f"{package}.a": tmp_path / "a.py", f"{package}.b": tmp_path / "b.py"}
    paths[f"{package}.a"].write_text("from .b import g\n")
    paths[f"{package}.b"].write_text("def g():\n    from .a import f\n    return f\n")

    def graph(lazy: bool) -> dict[str, set[str]]:
        return {m: {i for i in modules_imported(p, m, lazy) if i in paths and i != m} for m, p in paths.items()}

    assert circles(graph(False)) == []
    assert circles(graph(True)) == [sorted(paths)]


def test_no_file_of_parallel_is_over_the_line_limit():
    long = {m: n for m, p in all_modules().items() if m.startswith(PARALLEL + ".")
            and (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_PARALLEL_LINES}
    assert long == {}, f"files of parallel/ over {MAX_PARALLEL_LINES} lines: {long}"


def test_parallel_imports_no_private_name_of_another_module():
    """``from .x import _y`` between files of ``parallel/`` (or from elsewhere) is refused: what a
    module shares it names without an underscore."""
    found = []
    for module, path in all_modules().items():
        if not (module == PARALLEL or module.startswith(PARALLEL + ".")):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                target = _from_target(node, package)
                found += [f"{module} imports {target}.{a.name}" for a in node.names
                          if a.name.startswith("_") and not is_marssim_module(f"{target}.{a.name}")]
    assert found == []
