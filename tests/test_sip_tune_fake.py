"""The tuning run's orchestration on the CPU, with a stand-in for the GPU session: the kernel
"runs" by returning numpy reference outputs and its "time" is a synthetic function of where the
memory instructions sit in the patched cubin. Checks that ``tune`` writes a schedule that
re-applies to the original cubin, a patched cubin, a result file and calibration rows, and that
a checker failure (a "kernel" whose outputs differ) is never accepted."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from marssim.calibrate.sip import gpu as gpu_module
from marssim.calibrate.sip.anneal import AnnealConfig
from marssim.calibrate.sip.calibration import read_rows
from marssim.calibrate.sip.cubin import parse_cubin, read_cubin
from marssim.calibrate.sip.kernels import KERNELS
from marssim.calibrate.sip.sass import NvdisasmMissing, disassemble, find_nvdisasm
from marssim.calibrate.sip.schedule_file import apply_schedule, load_schedule

DATA = Path(__file__).parent / "data" / "sip"
CUBIN = DATA / "gemm_leaky_relu.sm_90a.cubin"


def _have_nvdisasm() -> bool:
    try:
        find_nvdisasm()
        return True
    except NvdisasmMissing:
        return False


pytestmark = pytest.mark.skipif(not _have_nvdisasm(), reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")


class FakeSession:
    """Implements the GpuSession methods tune() uses, without CUDA."""

    memory_words: frozenset = frozenset()
    frozen: dict = {}  # slot -> word: a kernel with another word in such a slot "computes garbage"

    def __init__(self, *a, **k):
        self.plan = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def upload(self, plan):
        self.plan = plan

    def refill(self, plan):
        self.plan = plan

    def load(self, cubin, name=None, shared_bytes=0):
        return parse_cubin(cubin).kernel(name)

    def unload(self, k):
        pass

    def run(self, k, plan):
        out = KERNELS["gemm_leaky_relu"].reference(plan)
        if any(k.words[slot] != word for slot, word in self.frozen.items()):
            out = {n: v + np.float16(1) for n, v in out.items()}
        return out

    def time(self, k, plan, repeats=1, warmup=0, flush_l2=True):
        cost = sum(slot for slot, w in enumerate(k.words) if w in self.memory_words)
        return [1e-5 * (1 + 1e-6 * cost)] * repeats

    def device_name(self):
        return "NVIDIA H100 80GB HBM3"

    def nvidia_driver(self):
        return "0.0"

    def driver_version(self):
        return "0.0"

    def sm_count(self):
        return 132


@pytest.fixture
def fake_gpu(monkeypatch):
    cubin = read_cubin(CUBIN)
    lst = next(iter(disassemble(cubin).values()))
    k = cubin.kernel()
    FakeSession.memory_words = frozenset(k.words[i.index] for i in lst.instructions if i.mem is not None)
    FakeSession.frozen = {}
    monkeypatch.setattr(gpu_module, "GpuSession", FakeSession)
    return cubin, lst


def _options(tmp_path, **kw):
    from marssim.calibrate.sip.tune import TuneOptions

    spec = KERNELS["gemm_leaky_relu"]
    return TuneOptions(spec, {"M": 64, "N": 64, "K": 128}, seeds=(0, 1), anneal=AnnealConfig(max_steps=40),
                       repeats=3, final_repeats=20, verify_launches=2, out_dir=tmp_path / "out",
                       calibration_csv=tmp_path / "traces" / "calibration" / "sip.csv", cubin=CUBIN.read_bytes(),
                       shared_bytes=65536, **kw)


def test_tune_writes_a_reapplicable_schedule_and_calibration_rows(fake_gpu, tmp_path):
    from marssim.calibrate.sip.tune import tune

    cubin, lst = fake_gpu
    lines = []
    report = tune(_options(tmp_path), progress=lines.append)
    assert report.tuned["median_s"] < report.baseline["median_s"] and report.mismatches == 0
    assert report.verified_elements == 2 * 64 * 64
    schedule = load_schedule(report.files["schedule"])
    assert schedule.cubin_sha256 == cubin.sha256 and schedule.provenance["device"] == "NVIDIA H100 80GB HBM3"
    assert apply_schedule(schedule, cubin) == Path(report.files["tuned"]).read_bytes()
    assert Path(report.files["original"]).read_bytes() == cubin.data
    result = json.loads(Path(report.files["result"]).read_text())
    assert result["moved_instructions"] == schedule.moved() > 0
    rows = read_rows(tmp_path / "traces" / "calibration" / "sip.csv")
    assert [r.tuning for r in rows] == ["none", "sip"]
    assert rows[1].median_s == pytest.approx(report.tuned["median_s"], rel=1e-6)  # 7 digits in the CSV
    assert rows[0].sms == 132
    # rows name the device as `gpu.calibration: H100` does, so a dgx-h100 design can use them
    assert {r.device for r in rows} == {"H100"} and "NVIDIA H100 80GB HBM3" in rows[0].note
    assert any("step 25/40" in line for line in lines)


def test_candidates_with_wrong_outputs_are_never_kept(fake_gpu, tmp_path):
    from marssim.calibrate.sip.tune import tune

    cubin, lst = fake_gpu
    k = cubin.kernel()
    # a schedule that displaces any memory instruction of the first basic block "computes garbage"
    first = lst.blocks[0]
    FakeSession.frozen = {i.index: k.words[i.index] for i in lst.instructions[first.start:first.end] if i.mem}
    report = tune(_options(tmp_path))
    assert report.mismatches == 0
    assert sum(r["check_failures"] for r in report.runs) > 0  # such candidates were proposed and refused
    tuned = parse_cubin(Path(report.files["tuned"]).read_bytes()).kernel()
    assert all(tuned.words[slot] == word for slot, word in FakeSession.frozen.items())
