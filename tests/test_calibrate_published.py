"""Vidur's published profiles as calibration rows: shapes, times, provenance and the mapping onto
the shards the simulator times, checked on verbatim excerpts of the source files
(tests/data/vidur/, MIT license)."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest

from marssim.cost.host_overheads import load_host_overheads, vidur_host_rows
from marssim.calibrate.published import (
    VIDUR_STACK, Provenance, default_tokens, vidur_files, vidur_rows,
)
from marssim.calibrate.table import parse_note
from marssim.cli import main
from marssim.cost import DataflowCost
from marssim.cost.calibrated import KernelTable, load_table
from marssim.errors import InputError

DATA = Path(__file__).parent / "data" / "vidur"
LLAMA = "data/profiling/compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv"
PHI = "data/profiling/compute/a100/microsoft/phi-2/mlp.csv"
COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"


def _prov(path: str) -> Provenance:
    return Provenance("microsoft/vidur", COMMIT, path, "MIT", "2024-07-24")


def _source_rows(path: str) -> list[dict[str, str]]:
    with open(DATA / path) as fh:
        return list(csv.DictReader(fh))


def _import(path: str, model: str, tokens=default_tokens):
    return vidur_rows((DATA / path).read_text(), _prov(path), "a100", model, tokens)


def test_default_tokens_are_powers_of_two_and_three_times_powers_of_two():
    chosen = [n for n in range(1, 5000) if default_tokens(n)]
    expected = sorted({2 ** i for i in range(13)} | {3 * 2 ** i for i in range(11)})
    assert chosen == [n for n in expected if n < 5000]
    assert not default_tokens(0) and not default_tokens(40) and default_tokens(24)


def test_gemm_rows_have_the_closed_form_shapes_of_the_tensor_parallel_layer():
    """Llama 3 8B: hidden 4,096, 32 query and 8 key/value heads of 128, FFN 14,336. One rank of
    tp: QKV n = (32 + 2 x 8) x 128 / tp, k = 4,096; the output projection n = 4,096, k = 4,096 / tp;
    the fused gate+up GEMM n = 2 x 14,336 / tp; down n = 4,096, k = 14,336 / tp; m = tokens."""
    result = _import(LLAMA, "meta-llama/Meta-Llama-3-8B")
    expected = {"attn_pre_proj": lambda tp: (48 * 128 // tp, 4096), "attn_post_proj": lambda tp: (4096, 4096 // tp),
                "mlp_up_proj": lambda tp: (2 * 14336 // tp, 4096), "mlp_down_proj": lambda tp: (4096, 14336 // tp)}
    seen = set()
    for r in result.rows:
        if r.kind != "gemm":
            continue
        note = parse_note(r.note)
        op, tp, tokens = note["op"], int(note["tp"]), int(note["num_tokens"])
        assert (r.batch, r.m) == (1, tokens)
        assert (r.n, r.k) == expected[op](tp)
        assert r.flops == 2 * r.m * r.n * r.k
        assert r.bytes == 2 * (r.m * r.k + r.k * r.n + r.m * r.n)  # fp16 operands and result
        seen.add((op, tp, tokens))
    assert {(op, tp, n) for op in expected for tp in (1, 2) for n in (1, 24, 512, 2048)} <= seen


def test_times_and_provenance_come_from_the_source_rows():
    result = _import(LLAMA, "meta-llama/Meta-Llama-3-8B")
    source = _source_rows(LLAMA)
    first = {}
    for row in source:  # the first row of a (tokens, tp) profiled twice
        first.setdefault((int(row["num_tokens"]), int(row["num_tensor_parallel_workers"])), row)
    for r in result.rows:
        note = parse_note(r.note)
        row = first[(int(note["num_tokens"]), int(note["tp"]))]
        assert r.median_s == pytest.approx(float(row[f"time_stats.{note['op']}.median"]) * 1e-3, rel=1e-12)
        assert float(note["std_s"]) == pytest.approx(float(row[f"time_stats.{note['op']}.std"]) * 1e-3, rel=1e-3)
        assert (note["source"], note["commit"], note["file"], note["license"]) == ("microsoft/vidur", COMMIT, LLAMA, "MIT")
        assert (r.stack, r.device, r.sms, r.dtype, r.tuning, r.date) == (VIDUR_STACK, "A100", 108, "fp16", "vendor",
                                                                         "2024-07-24")
        assert r.samples == (21 if note["op"] == "emb" else 20)
    # the second profile of 2048 tokens is a repeat, not a row; its ratio to the first is kept
    dup = [row for row in source if (row["num_tokens"], row["num_tensor_parallel_workers"]) == ("2048", "1")]
    assert len(dup) == 2
    ratio = float(dup[1]["time_stats.mlp_down_proj.median"]) / float(dup[0]["time_stats.mlp_down_proj.median"])
    assert ratio in result.repeats["mlp_down_proj"]


def test_token_filter_and_shape_deduplication():
    everything = _import(LLAMA, "meta-llama/Meta-Llama-3-8B", tokens=None)
    default = _import(LLAMA, "meta-llama/Meta-Llama-3-8B")
    tokens = {int(parse_note(r.note)["num_tokens"]) for r in everything.rows}
    assert 40 in tokens and 40 not in {int(parse_note(r.note)["num_tokens"]) for r in default.rows}
    shapes = [(r.device, r.stack, r.shape) for r in everything.rows]
    assert len(shapes) == len(set(shapes))  # one row per shape
    # the norms are replicated under tensor parallelism: tp=2's are repeats of tp=1's
    norms = [r for r in everything.rows if r.kind == "norm"]
    assert {parse_note(r.note)["tp"] for r in norms} == {"1"}


def test_exact_rows_are_what_the_cost_model_charges_the_simulators_shards():
    """Every shard the parallel lowering times (tp_shards) of a layer Vidur profiled finds its row
    by the cost model's own key and is charged the measured time -- also bf16 shards, which take
    the fp16 rows (same tensor cores), the fused gate+up GEMM (``mlp.fc1``) included; the combined
    rotary kernel matches no shard."""
    from marssim.calibrate.grid import _point
    from marssim.calibrate.llm import tp_shards
    from marssim.parallel.config import ParallelConfig
    from marssim.system import load_system
    from marssim.workload import load_workload

    result = _import(LLAMA, "meta-llama/Meta-Llama-3-8B")
    model = DataflowCost(calibration=KernelTable(tuple(result.rows)))
    design = load_system("dgx-a100-cluster:nodes=1").design("gpu0", "a100")
    assert design.gpu.calibration == "A100" and design.gpu.stack == VIDUR_STACK
    by_key = {r.shape: r for r in result.rows}
    expected = {"embed.tokens", "layers.0.input_norm", "layers.0.attn.qkv", "layers.0.attn.proj", "layers.0.post_norm",
                "layers.0.mlp.fc1", "layers.0.mlp.act", "layers.0.mlp.down", "layers.0.mlp.residual",
                "layers.0.attn.residual", "final_norm"}
    for dtype in ("fp16", "bf16"):
        for tokens, tp in ((512, 2), (2048, 1)):
            graph = load_workload(f"llama3-8b:layers=1,mode=prefill,seq={tokens},batch=1,dtype={dtype}")
            found = set()
            for op, shard in tp_shards(graph, ParallelConfig(tp=tp, micro_batch=1)):
                points = [_point(shard, k, op.name) for k in ("gemm", "elementwise", "norm", "embedding")]
                key = next((p.key for p in points if p is not None), None)
                row = by_key.get(key[:1] + ("fp16",) + key[2:]) if key else None
                cost = model.op_cost(shard, design)
                if row is None:
                    assert cost.model != "measured", op.name
                    continue
                assert (cost.model, cost.time) == ("measured", row.median_s), op.name
                found.add(op.name)
            assert found == expected, (tokens, tp)


def test_phi2_operators_without_a_marssim_op_are_reported_not_invented():
    result = _import(PHI, "microsoft/phi-2")
    reasons = {(op, reason.split(" ")[0]) for op, _, reason in result.unmapped}
    assert reasons == {("add", "three-way"), ("attn_rope", "partial")}
    assert sum(result.unmapped.values()) == 2 * 2  # two operators at each of the two token counts
    ops = {parse_note(r.note)["op"] for r in result.rows}
    assert "add" not in ops and "attn_rope" not in ops and "mlp_up_proj" in ops  # fc1: an exact GEMM of GeLU MLPs
    fc1 = next(r for r in result.rows if parse_note(r.note)["op"] == "mlp_up_proj")
    assert (fc1.n, fc1.k) == (10240, 2560) and parse_note(fc1.note)["mapping"] == "exact"


def test_a_file_that_is_not_vidurs_is_refused(tmp_path):
    with pytest.raises(InputError, match="num_tokens"):
        vidur_rows("a,b\n1,2\n", _prov("x.csv"), "a100", "m")
    with pytest.raises(InputError, match="gpu"):
        vidur_rows((DATA / LLAMA).read_text(), _prov(LLAMA), "v100", "meta-llama/Meta-Llama-3-8B")


def test_vidur_files_finds_gpu_and_model():
    paths = [LLAMA, PHI, "data/profiling/compute/a40/x/y/mlp.csv", "data/profiling/network/a100_dgx/all_reduce.csv"]
    assert vidur_files(paths) == [("a100", "meta-llama/Meta-Llama-3-8B", LLAMA), ("a100", "microsoft/phi-2", PHI)]


def test_host_overheads_convert_milliseconds_and_keep_provenance(tmp_path):
    path = "data/profiling/a100/cpu_overheads.csv"
    rows = vidur_host_rows((DATA / path).read_text(), "A100", VIDUR_STACK, "microsoft/vidur", "6d98aa8", path, "MIT",
                           "2024-05-08")
    source = _source_rows(path)
    assert len(rows) == len(source) * (2 * 8 + 1)  # 8 stages x (mean, median) and the Ray call's mean
    sched = next(r for r in rows if r.stage == "schedule" and r.statistic == "median")
    assert sched.seconds == pytest.approx(float(source[0]["schedule_median"]) * 1e-3)
    assert (sched.model, sched.batch_size, sched.tp) == (source[0]["model_name"], int(source[0]["batch_size"]),
                                                         int(source[0]["tensor_parallel_degree"]))


def test_cli_imports_a_directory_and_the_tables_load(tmp_path, capsys):
    out = tmp_path / "calibration"
    assert main(["calibrate", "import", "vidur-compute", "--from", str(DATA), "--commit", COMMIT, "--date",
                 "2024-07-24", "--gpus", "a100", "--out", str(out)]) == 0
    table = load_table(out / "A100.csv")
    assert table.stacks() == (VIDUR_STACK,) and table.devices() == ("A100",)
    text = capsys.readouterr().out
    assert "not mapped: add of microsoft/phi-2" in text
    host = tmp_path / "host.csv"
    assert main(["calibrate", "import", "vidur-host", "--from", str(DATA), "--commit", "6d98aa8", "--date",
                 "2024-05-08", "--out", str(host)]) == 0
    assert len(load_host_overheads(host)) == 3 * 17
    # a plain directory without a date is one clear error
    assert main(["calibrate", "import", "vidur-host", "--from", str(DATA), "--commit", "6d98aa8"]) == 2
    assert "--date" in capsys.readouterr().err


def test_shipped_tables_hold_the_imported_stack_with_provenance():
    from marssim.data import calibration

    a100 = load_table(calibration() / "A100.csv")
    assert a100.stacks() == (VIDUR_STACK,)
    for r in a100.rows[:: max(1, len(a100.rows) // 50)]:
        note = parse_note(r.note)
        assert note["source"] == "microsoft/vidur" and note["license"] == "MIT" and len(note["commit"]) == 40
        assert note["file"].startswith("data/profiling/compute/a100/")
    h100 = load_table(calibration() / "H100.csv")
    assert set(h100.stacks()) == {"pytorch-2.11.0+cu130", VIDUR_STACK}


def test_cli_imports_collectives_from_vidur_and_xla(tmp_path, capsys):
    from marssim.collectives.measured import load_collectives

    out = tmp_path / "collectives"
    assert main(["calibrate", "import", "vidur-network", "--from", str(DATA), "--commit", COMMIT, "--date",
                 "2024-05-14", "--out", str(out)]) == 0
    rows = load_collectives(out / "vidur-2024.csv")
    assert {(r.system, r.ranks, r.ranks_per_node) for r in rows} == {("dgx-a100", 4, 4), ("dgx-a100+net", 2, 1)}
    assert all(r.commit == COMMIT and r.license == "MIT" and r.stack == VIDUR_STACK for r in rows)
    xla = Path(__file__).parent / "data" / "xla" / "collective_interpolator_data_sm90_excerpt.h"
    assert main(["calibrate", "import", "xla-collectives", "--from", str(xla), "--commit", "v", "--date", "2025-01-01",
                 "--out", str(out)]) == 0
    assert len(load_collectives(out / "xla-2025.csv")) == 26
    assert main(["calibrate", "import", "xla-collectives", "--from", str(xla), "--commit", "v"]) == 2  # no --date
    assert "--date" in capsys.readouterr().err
