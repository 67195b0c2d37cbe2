"""A wheel carries the shipped systems, example mappings, calibration tables and request traces, and works from
any directory: built offline from a copy of the source with the installed setuptools, installed
into a fresh virtual environment (the dependencies come from the environment running the tests)
and run from a temporary directory with nothing of the checkout on its paths."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from marssim.data import DATA_PACKAGES, calibration, collectives, host_overheads, requests, topologies

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "README.md", "marssim", *DATA_PACKAGES.values())


def _setuptools_builds_this_project() -> bool:
    major = int(version("setuptools").split(".")[0])
    return major >= 77  # pyproject's `license = "..."` needs it (the test extras install it)


def _parent_site_dirs() -> str:
    """The site directories of the interpreter running the tests, one per line (a .pth file)."""
    import site
    import sysconfig

    dirs = [*site.getsitepackages(), sysconfig.get_path("purelib"), sysconfig.get_path("platlib")]
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return "\n".join(dict.fromkeys(d for d in dirs if Path(d).is_dir())) + "\n"


def _run(args: list, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{' '.join(map(str, args))} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_build_maps_the_data_packages_the_package_looks_for():
    tree = ast.parse((ROOT / "setup.py").read_text())
    assigned = next(node.value for node in tree.body
                    if isinstance(node, ast.Assign) and node.targets[0].id == "DATA_PACKAGES")
    assert ast.literal_eval(assigned) == DATA_PACKAGES
    for directory in DATA_PACKAGES.values():
        assert (ROOT / directory).is_dir()


def test_a_checkout_finds_the_repository_directories():
    """Here (an editable install or the source tree on the path) the data are the checkout's."""
    assert topologies() == ROOT / "topologies" and calibration() == ROOT / "traces" / "calibration"
    assert collectives() == ROOT / "traces" / "collectives" and host_overheads() == ROOT / "traces" / "host-overheads"
    assert requests() == ROOT / "traces" / "requests"


@pytest.mark.slow
@pytest.mark.skipif(not _setuptools_builds_this_project(),
                    reason="building the wheel offline needs setuptools>=77 (pip install -e '.[test]')")
def test_a_wheel_installed_elsewhere_ships_its_data_and_runs_from_another_directory(tmp_path):
    src = tmp_path / "src"
    for name in SOURCES:
        target = src / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, target, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy2(ROOT / name, target)
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q",
          "-w", dist, src], tmp_path)
    wheel = next(dist.glob("marssim-*.whl"))

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path)
    python = venv / "bin" / "python"
    # the dependencies (and pip) come from the environment running the tests -- a system Python, a
    # conda environment or a virtual environment alike: its site directories are appended to the new
    # environment's path by a .pth file (whose own .pth files, an editable install's among them, are
    # not processed there), after the new environment's own site-packages, where the wheel goes
    _run([python, "-c", f"import site, pathlib; pathlib.Path(site.getsitepackages()[0], 'parent.pth')"
                        f".write_text({_parent_site_dirs()!r})"], tmp_path)
    # nothing of the checkout on the path, for the install too (a checkout on PYTHONPATH holds the
    # project's metadata, which pip would take for the package installed already)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "MARSSIM_TOPOLOGIES", "MARSSIM_TRACES")}
    _run([python, "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], tmp_path, env)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    marssim = venv / "bin" / "marssim"
    site = _run([python, "-c", "import marssim, marssim.data as d; print(marssim.__file__); "
                               "print(d.topologies()); print(d.calibration()); print(d.collectives()); "
                               "print(d.host_overheads()); print(d.requests()); print(d.attention_kernels())"],
                elsewhere, env).stdout.split()
    assert all(Path(p).is_relative_to(venv) for p in site), site  # the wheel's copy, not the checkout
    for directory, name in ((site[2], "A100.csv"), (site[3], "vidur-2024.csv"), (site[4], "A100.csv"),
                            (site[5], "README.md"), (site[6], "pytorch-24.03-h200.csv")):
        assert (Path(directory) / name).is_file(), (directory, name)

    listed = _run([marssim, "systems"], elsewhere, env).stdout
    for path in sorted((ROOT / "topologies").glob("*.yaml")):
        assert path.stem in listed
    _run([marssim, "demo", "--help"], elsewhere, env)
    # a shipped example mapping on a GPU system whose design names the shipped H100 table: a
    # missing table would be an error, so the simulation shows the table was found
    mapping = Path(site[1]) / "mappings" / "dgx-h100-bert-base.yaml"
    assert mapping.is_file()
    out = _run([marssim, "simulate", "--mapping", mapping, "--batch", "1", "--out", "run"], elsewhere, env)
    assert "makespan" in out.stdout and (elsewhere / "run" / "summary.json").is_file()
    # the shipped request traces, by name, from the wheel's copy
    assert (Path(site[5]) / "azure-conv-2023.csv").is_file() and (Path(site[5]) / "README.md").is_file()
    out = _run([marssim, "serve", "--system", "dgx-h100", "--model", "llama:layers=2,hidden=256,heads=4,ffn=512,"
                "kv_heads=4,vocab=1000", "--pool", "replicas=1,tp=1", "--replay", "azure-code-2023", "--requests", "5",
                "--allow-uncalibrated"], elsewhere, env)
    assert "TTFT" in out.stdout
