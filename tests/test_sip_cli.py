"""``marssim sip`` on the CPU: inspect, apply, verify, and tune's argument checks and its
"needs a CUDA device" exit."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from marssim.calibrate.sip.cubin import read_cubin
from marssim.calibrate.sip.deps import Legality
from marssim.calibrate.sip.perturb import apply_swap, legal_swaps, patch, random_move
from marssim.calibrate.sip.sass import NvdisasmMissing, disassemble, find_nvdisasm
from marssim.calibrate.sip.schedule_file import new_schedule, save_schedule
from marssim.cli import main

DATA = Path(__file__).parent / "data" / "sip"
GEMM = DATA / "gemm_leaky_relu.sm_90a.cubin"


def _have_nvdisasm() -> bool:
    try:
        find_nvdisasm()
        return True
    except NvdisasmMissing:
        return False


needs_nvdisasm = pytest.mark.skipif(not _have_nvdisasm(), reason="nvdisasm not installed (pip install nvidia-cuda-nvdisasm)")


def _cuda_present() -> bool:
    from marssim.calibrate.sip.gpu import cuda_device_available

    return cuda_device_available()[0]


@pytest.fixture(scope="module")
def schedule(tmp_path_factory):
    cubin = read_cubin(GEMM)
    lst = next(iter(disassemble(cubin).values()))
    lg = Legality(lst)
    rng = random.Random(4)
    order, swaps = tuple(range(len(lst))), []
    for _ in range(25):
        m = random_move(rng, lg, order, "sip")
        order = apply_swap(order, m.pos)
        swaps.append(m.pos)
    path = tmp_path_factory.mktemp("sched") / "gemm.schedule.json"
    save_schedule(new_schedule(cubin, lst.kernel, swaps, order, {"device": "test", "verified_elements": 0,
                                                                  "mismatches": 0}), path)
    return path, order, cubin, lst


@needs_nvdisasm
def test_inspect_reports_counts_that_match_the_library(capsys):
    assert main(["sip", "inspect", str(GEMM)]) == 0
    out = capsys.readouterr().out
    cubin = read_cubin(GEMM)
    lst = next(iter(disassemble(cubin).values()))
    n_swaps = len(legal_swaps(Legality(lst), tuple(range(len(lst)))))
    assert "sm_90a" in out and f"{len(lst)} instructions in {len(lst.blocks)} basic blocks" in out
    assert f"legal adjacent swaps {n_swaps}," in out


@needs_nvdisasm
def test_inspect_lists_control_codes(capsys):
    assert main(["sip", "inspect", str(DATA / "saxpy_loop.sm_90.cubin"), "--instructions"]) == 0
    out = capsys.readouterr().out
    # S2R R0 sets write scoreboard 0; the IMAD that reads R0 and R3 waits on it
    assert "S01 Y W0 R- []" in out and "S2R R0, SR_CTAID.X" in out
    assert "S05 - W- R- [0]" in out and "IMAD R0, R0, UR4, R3" in out


@needs_nvdisasm
def test_apply_and_verify(schedule, tmp_path, capsys):
    path, order, cubin, lst = schedule
    out = tmp_path / "tuned.cubin"
    assert main(["sip", "apply", str(path), str(GEMM), "-o", str(out)]) == 0
    assert out.read_bytes() == patch(cubin, lst.kernel, order)
    assert main(["sip", "verify", str(path), str(GEMM)]) == 0
    assert "ok: sha256 matches" in capsys.readouterr().out


@needs_nvdisasm
def test_apply_refuses_another_cubin_without_writing(schedule, tmp_path, capsys):
    path, *_ = schedule
    out = tmp_path / "never.cubin"
    assert main(["sip", "apply", str(path), str(DATA / "attention_fwd.sm_90a.cubin"), "-o", str(out)]) == 2
    assert "not the cubin it was tuned on" in capsys.readouterr().err
    assert not out.exists() and not list(tmp_path.iterdir())


def test_apply_reports_bad_schedule_files(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "something else"}))
    assert main(["sip", "apply", str(bad), str(GEMM), "-o", str(tmp_path / "x.cubin")]) == 2
    err = capsys.readouterr().err
    assert "bad.json: format:" in err and "Traceback" not in err


@pytest.mark.skipif(_cuda_present(), reason="a CUDA device is present: tune would run")
def test_tune_without_cuda_exits_2_after_validating_arguments(capsys):
    assert main(["sip", "tune", "--kernel", "gemm_leaky_relu", "--shape", "M=512,N=512,K=2048", "--steps", "5",
                 "--seeds", "2"]) == 2
    assert "a CUDA device is required" in capsys.readouterr().err


@pytest.mark.parametrize("argv,message", [
    (["--kernel", "nope"], "--kernel: expected one of attention_fwd, gemm, gemm_leaky_relu"),
    (["--kernel", "gemm", "--shape", "M=100"], "M must be a multiple of 64"),
    (["--kernel", "gemm", "--shape", "Q=64"], "keys from M, N, K"),
    (["--kernel", "attention_fwd", "--shape", "HEAD_DIM=48"], "HEAD_DIM must be 16, 32, 64 or 128"),
    (["--kernel", "gemm", "--seeds", "x"], "--seeds"),
    (["--kernel", "gemm", "--t0", "0.01"], "t0 > t_min"),
])
def test_tune_argument_errors_come_first(argv, message, capsys):
    assert main(["sip", "tune", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
