"""A search's worker processes end when the search's process does, however it ends: killed
with SIGKILL (no handler runs, no pool is shut down), its workers are gone within seconds
instead of computing on for the rest of their simulations."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

ROOT = Path(__file__).resolve().parents[1]


def _children(pid: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                out.append(int(entry.name))
    return out


def _running(pid: int) -> bool:
    """Alive and not a zombie waiting to be reaped."""
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def test_killing_a_search_ends_its_workers(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    # a search far longer than the test: it is killed once its two workers are computing
    search = subprocess.Popen([sys.executable, "-m", "marssim", "search", "--system", "mars-adaptive-16",
                               "--workload", "resnet50:batch=8", "--workers", "2", "--generations", "100000",
                               "--budget", "1000000", "--quiet"], cwd=tmp_path, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    workers: list[int] = []
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(workers) < 2:
            assert search.poll() is None, search.stderr.read().decode()
            workers = _children(search.pid)
            time.sleep(0.2)
        assert len(workers) >= 2, "the search started no worker processes"
        time.sleep(2.0)  # the workers take candidates to evaluate
        assert all(_running(w) for w in workers)
        search.send_signal(signal.SIGKILL)
        search.wait(10)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(_running(w) for w in workers):
            time.sleep(0.1)
        left = [w for w in workers if _running(w)]
        assert not left, f"workers {left} outlived the search's process"
    finally:  # nothing of the test's left behind, whatever it found
        if search.poll() is None:
            search.kill()
            search.wait(10)
        for w in workers:
            if _running(w):
                os.kill(w, signal.SIGKILL)
