"""Every ``marssim`` command shown in README.md and docs/*.md works as written.

The commands are read from the fenced code blocks of the pages (continuation lines joined,
comments dropped), so a page's new example is tested without listing it here. Each command is

* parsed by the command line's own parser (every flag and choice exists);
* checked: the systems, workloads, models, mappings and parallel configurations it names load,
  and a configuration fits the GPUs' memory (the closed form the CLI checks before simulating);
* and the light ones are run in full, in page order in one directory (``marssim trace run/`` reads
  what the ``simulate --out run/`` before it wrote; the checkout's ``tests``, ``topologies`` and
  ``traces`` linked into it, as the pages' relative paths are the checkout's), each exiting 0. Heavy ones run in a smaller
  form, stated in :data:`SMALLER` (fewer sampled mappings); the rest, whose run takes from
  tens of seconds to minutes of CPU (searches, sweeps, lowerings of a hundred GPUs or more, the
  published-run validation) or a GPU, are parsed and checked only (:func:`_how` says why).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from marssim.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
SHELL = ("bash", "sh", "shell", "console", "")


@dataclass(frozen=True)
class Example:
    page: str
    line: int
    argv: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.page}:{self.line}"


def examples(path: Path) -> list[Example]:
    """The ``marssim`` commands of ``path``'s shell (or unlabelled) code blocks."""
    lines = path.read_text(encoding="utf-8").splitlines()
    out: list[Example] = []
    fence = None
    i = 0
    while i < len(lines):
        text = lines[i]
        if text.lstrip().startswith("```"):
            fence = None if fence is not None else text.strip()[3:].strip()
            i += 1
            continue
        if fence in SHELL:
            first = i
            while text.rstrip().endswith("\\") and i + 1 < len(lines):
                i += 1
                text = text.rstrip()[:-1] + " " + lines[i].strip()
            for part in text.split("&&"):
                part = part.strip()
                if part.startswith("marssim "):
                    argv = tuple(shlex.split(part, comments=True))[1:]
                    page = path.relative_to(ROOT).as_posix() if path.is_relative_to(ROOT) else path.name
                    out.append(Example(page, first + 1, argv))
        i += 1
    return out


EXAMPLES = [e for page in PAGES for e in examples(page)]

# heavy commands run in a smaller form: flag -> the value used instead (the rest as written)
SMALLER = {
    ("validate", "--system", "ring-8"): {"--sample": "12"},  # 12 sampled mappings instead of 200
}


def _smaller(argv: tuple[str, ...]) -> tuple[str, ...] | None:
    for key, changes in SMALLER.items():
        if argv[:len(key)] == key:
            out = list(argv)
            for flag, value in changes.items():
                if flag in out:
                    out[out.index(flag) + 1] = value
                else:
                    out += [flag, value]
            return tuple(out)
    return None


def _how(argv: tuple[str, ...]) -> tuple[str, str]:
    """``("run" | "check", why)``: whether an example runs here, and if not, why not."""
    verb = argv[0]
    words = set(argv)
    if verb in ("calibrate", "sip") and "--dry-run" not in words and "inspect" not in words:
        return "check", "needs a CUDA GPU"
    if verb == "sip" and "inspect" in words:
        return "check", "CUBIN stands for the reader's own file"
    if "--mappings" in words or "--deployment" in words:
        return "check", "reads the reader's own files, or a search's output"
    if verb == "demo":
        return "check", "tested by tests/test_demo.py"
    if _smaller(argv) is not None:
        return "run", "smaller"
    light_verbs = ("systems", "show", "workloads", "cost", "trace")
    if verb in light_verbs or (verb == "calibrate" and "--dry-run" in words):
        return "run", ""
    if verb in ("simulate", "estimate"):
        system = argv[argv.index("--system") + 1] if "--system" in words else ""
        if "--mapping" in words or system in ("dgx-h100",):
            return "run", ""
        return "check", "a lowering of a hundred GPUs or more (ten seconds to minutes of CPU)"
    if verb == "serve":
        return "check", "a serving run of thousands of requests on a cluster (minutes of CPU)"
    return "check", "a search, sweep or validation of minutes"


def _value(argv, flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def _check(argv: tuple[str, ...]) -> None:
    """Load what ``argv`` names (raises InputError/CapacityError where the CLI would exit 2)."""
    from marssim.cli._plan import load_plan_args
    from marssim.parallel import ParallelConfig
    from marssim.parallel.memory import check_memory
    from marssim.system import load_system
    from marssim.workload import load_workload

    args = build_parser().parse_args(list(argv))
    if args.verb in ("simulate", "estimate"):
        plan, graph, system = load_plan_args(args)
        if isinstance(plan, ParallelConfig):
            check_memory(graph, system, plan)
        return
    for flag in ("--system", "--also-system"):
        for i, word in enumerate(argv):
            if word == flag:
                load_system(argv[i + 1])
    if _value(argv, "--workload"):
        load_workload(_value(argv, "--workload"))
    if _value(argv, "--model"):
        from marssim.serve import load_model

        load_model(_value(argv, "--model"))
    if _value(argv, "--published"):
        from marssim.validate.published import load_published

        assert load_published(_value(argv, "--published"))


def test_the_pages_have_examples():
    assert len(EXAMPLES) > 30
    assert {e.page for e in EXAMPLES} >= {"README.md", "docs/parallelism.md", "docs/serving.md",
                                          "docs/validation.md"}


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda e: e.id)
def test_every_example_parses(example):
    try:
        args = build_parser().parse_args(list(example.argv))
    except SystemExit as exc:  # argparse printed why
        pytest.fail(f"{example.id}: `marssim {' '.join(example.argv)}` does not parse (exit {exc.code})")
    assert getattr(args, "func", None) is not None


@pytest.mark.parametrize("example", [e for e in EXAMPLES if _how(e.argv)[0] == "check"], ids=lambda e: e.id)
def test_every_example_not_run_here_loads_its_inputs(example, monkeypatch):
    why = _how(example.argv)[1]
    if why in ("needs a CUDA GPU", "CUBIN stands for the reader's own file",
               "reads the reader's own files, or a search's output", "tested by tests/test_demo.py"):
        pytest.skip(why)
    monkeypatch.chdir(ROOT)  # the pages' relative paths are the checkout's
    _check(example.argv)


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A directory where the examples write, reading the checkout's files by the relative paths
    the pages give (run from the checkout's root)."""
    path = tmp_path_factory.mktemp("examples")
    for name in ("tests", "topologies", "traces"):
        (path / name).symlink_to(ROOT / name, target_is_directory=True)
    return path


@pytest.mark.parametrize("example", [e for e in EXAMPLES if _how(e.argv)[0] == "run"], ids=lambda e: e.id)
def test_the_light_examples_run(example, workdir, monkeypatch, capsys):
    monkeypatch.chdir(workdir)
    argv = _smaller(example.argv) or example.argv
    code = main(list(argv))
    captured = capsys.readouterr()
    assert code == 0, f"{example.id}: `marssim {' '.join(argv)}` exited {code}: {captured.err.strip()[-500:]}"
    assert "Traceback" not in captured.err
    for flag in ("--out", "--trace", "--plot", "--intervals"):
        written = _value(argv, flag)
        if written:
            assert (workdir / written).exists(), f"{example.id}: {flag} {written} was not written"


def test_the_parser_of_examples_reads_continuations_and_comments(tmp_path):
    page = tmp_path / "page.md"
    page.write_text("text\n```bash\nmarssim show a:b=1 \\\n    --x 2   # a comment\necho no\n```\n"
                    "```yaml\nmarssim: not a command\n```\n```\nmarssim systems && marssim workloads\n```\n")
    found = examples(page)
    assert [e.argv for e in found] == [("show", "a:b=1", "--x", "2"), ("systems",), ("workloads",)]
    assert [e.line for e in found] == [3, 11, 11]
    assert re.fullmatch(r".*page\.md", found[0].page)
