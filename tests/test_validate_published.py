"""Predictions against published measurements: the shipped tables load and every row names a
configuration its system and workload can take; the converted figures of the shipped tables
follow from what their sources publish by the conversions their headers state; errors and their
summary are what they say; bad tables and flags that do not apply are refused on one line."""

from __future__ import annotations

import math
import re
from dataclasses import replace

import numpy as np
import pytest

from marssim.cli import main
from marssim.errors import InputError
from marssim.parallel import chunk_layers, parse_parallel
from marssim.plan import bind_parallel
from marssim.system import load_system
from marssim.serve.deployment import Deployment, check_deployment, parse_pool
from marssim.serve.model import load_model
from marssim.serve.poolcheck import check_pool
from marssim.validate.published import (PublishedRun, PublishedServing, ServingPrediction, format_predictions,
                                        load_published, predict, predict_all, published_tables, TableKind,
                                        table_kind)
from marssim.validate.published_serving import LatencyStatistic, figure_summaries
from marssim.validate.accuracy import summary
from marssim.workload import load_workload

SMALL = "gpt:layers=4,hidden=512,heads=8,seq=256,vocab=8192,mode=train"
SMALL_SERVED = "llama:layers=2,hidden=256,heads=4,kv_heads=4,ffn=512,vocab=1024,dtype=fp8"
SERVE_HEADER = "name,system,model,deployment,input_tokens,output_tokens,requests,measured_output_tokens_per_s,source\n"


def test_the_shipped_tables_name_runs_their_systems_can_take():
    tables = published_tables()
    assert {"korthikanti2022-table5", "nemo2407-h100-fp8", "nemo2403-h100-fp8-long-context",
            "megatron-bridge-2511-fp8", "megatron-bridge-2511-mxfp8", "megatron-bridge-2604-fp8-fp4",
            "megatron-bridge-2604-moe", "megatron-bridge-2604-qwen3-235b",
            "trtllm-1.0-h100-h200-fp8-throughput",
            "sglang-0.3.0-vllm-0.6.0-bf16-latency"} <= set(tables)
    for name in tables:
        runs = load_published(name)
        assert runs and all(r.source for r in runs)
        for r in runs:
            system = load_system(r.system)
            if isinstance(r, PublishedServing):
                model = load_model(r.model)
                pool = parse_pool(r.deployment, r.name)
                check_deployment(Deployment((pool,)), r.name)
                check_pool(pool, model, r.name, "")
                assert pool.gpus <= len(system.accelerators) and not r.measured_output_tokens_per_s <= 0
                assert any(v > 0 for v in (r.measured_output_tokens_per_s, r.measured_ttft_s, r.measured_tpot_s))
                assert r.input_tokens + r.output_tokens <= model.max_positions
                continue
            assert r.measured_iteration_s > 0
            cfg, graph = bind_parallel(parse_parallel(r.parallel), load_workload(r.workload), system, r.name,
                                       micro_batch_given=True, batch_given=False)
            assert cfg.gpus == len(system.accelerators) and graph.batch == cfg.micro_batch


def _sizes(run: PublishedRun) -> tuple[int, int, int]:
    """GPUs, global batch and sequence length of a training row, read off its system, parallel
    configuration and workload (not off its measured figure)."""
    system = load_system(run.system)
    cfg = parse_parallel(run.parallel)
    seq = load_workload(run.workload).meta["transformer"].seq
    return len(system.accelerators), cfg.global_batch, seq


def test_the_nemo_summary_rows_are_the_published_tokens_per_gpu_converted():
    """measured_iteration_s = GBS x seq / (tokens/s/GPU x GPUs), the tokens/s/GPU as each row's
    source names it: every row reproduces its source's figure to the 4-5 digits it gives."""
    runs = load_published("nemo2407-h100-fp8")
    assert len(runs) == 12 and sum("cp=" in r.parallel for r in runs) == 2
    for r in runs:
        tokens = float(re.search(r"\((\d+) tokens/s/GPU\)", r.source).group(1))
        gpus, gbs, seq = _sizes(r)
        assert gbs * seq / (r.measured_iteration_s * gpus) == pytest.approx(tokens, rel=1e-4), r.name
        assert "dtype=fp8" in r.workload


# Megatron-Bridge 25.11 performance summary, FP8-CS rows: GPUs, GBS, MBS, TP, PP, CP, VP, tokens/s/GPU
MEGATRON_BRIDGE_2511 = {
    "H100 LLAMA3-70B 64 GPUs": (64, 128, 1, 4, 8, 1, 5, 1602),
    "H100 LLAMA3.1-405B 1024 GPUs": (1024, 512, 1, 8, 8, 2, 8, 292),
    "B200 LLAMA3-8B 8 GPUs": (8, 128, 2, 1, 1, 1, 1, 30624),
    "B200 LLAMA3.1-405B 128 GPUs": (128, 64, 1, 4, 8, 2, 8, 661),
    "GB200 LLAMA3-8B 8 GPUs": (8, 128, 2, 1, 1, 1, 1, 31508),
    "GB200 LLAMA3.1-405B 256 GPUs": (256, 1536, 1, 4, 16, 1, 4, 813),
    "GB300 LLAMA3-8B 8 GPUs": (8, 128, 2, 1, 1, 1, 1, 37556),
    "GB300 LLAMA3.1-405B 256 GPUs": (256, 1536, 1, 2, 8, 2, 4, 999),
}


def test_the_megatron_bridge_rows_are_the_published_layouts_and_tokens_per_gpu_converted():
    """Each row's GPUs, batch and parallel layout are the summary's, its iteration the tokens/s/GPU
    converted; every row runs FP8 with current scaling and FP8 parameters, and the 405B rows count
    the embedding and loss in the pipeline split (126 + 2 layers in pp x vp chunks)."""
    runs = load_published("megatron-bridge-2511-fp8")
    assert {r.name for r in runs} == set(MEGATRON_BRIDGE_2511)
    for r in runs:
        gpus, gbs, mbs, tp, pp, cp, vp, tokens = MEGATRON_BRIDGE_2511[r.name]
        cfg = parse_parallel(r.parallel)
        assert (len(load_system(r.system).accelerators), cfg.global_batch, cfg.micro_batch) == (gpus, gbs, mbs)
        assert (cfg.tp, cfg.pp, cfg.cp, cfg.virtual_stages, cfg.dp) == (tp, pp, cp, vp, gpus // (tp * pp * cp))
        assert cfg.sp == (tp > 1) and cfg.tp_comm_overlap == (tp > 1)
        assert f"({tokens} tokens/s/GPU)" in r.source
        assert gbs * 8192 / (r.measured_iteration_s * gpus) == pytest.approx(tokens, rel=1e-4), r.name
        t = load_workload(r.workload).meta["transformer"]
        assert (t.gemm_dtype, t.fp8_recipe, t.fp8_param_gather, t.seq) == ("fp8", "current", True, 8192)
        assert t.vocab % (128 * tp) == 0 and t.vocab - 128 * tp < 128256 <= t.vocab  # padded as Megatron pads
        if t.layers == 126:
            assert cfg.account_for_embedding and cfg.account_for_loss and (126 + 2) % (pp * vp) == 0


def test_the_long_context_rows_are_the_published_flops_converted_by_the_stated_count():
    """measured_iteration_s = GBS x s x F(s) / (TFLOPS/GPU x 1e12 x GPUs), F the header's count
    per token (6 x GEMM weights + 12 layers s h + 6 h V) of LLAMA2-7B, recomputed here."""
    layers, h, ffn, vocab = 32, 4096, 11008, 32000
    runs = load_published("nemo2403-h100-fp8-long-context")
    assert [parse_parallel(r.parallel).cp for r in runs] == [1, 1, 2, 2, 4, 8, 16, 32]
    for r in runs:
        tflops = float(re.search(r"\((\d+) TFLOPS/GPU\)", r.source).group(1))
        gpus, gbs, seq = _sizes(r)
        per_token = 6 * layers * (4 * h * h + 3 * h * ffn) + 12 * layers * seq * h + 6 * h * vocab
        assert gbs * seq * per_token / (r.measured_iteration_s * gpus * 1e12) == pytest.approx(tflops, rel=1e-4)


NEMO_TABLES = ("nemo2403-h100-fp8-long-context", "nemo2407-h100-fp8")
FA2_2024 = "attention_kernels=pytorch-24.03-h200"


@pytest.mark.parametrize("table", NEMO_TABLES)
def test_the_nemo_rows_time_their_attention_by_flashattention2_of_2024(table, cost):
    """NeMo's launcher of 24.03-24.07 ran with cuDNN's fused attention off (NVTE_FUSED_ATTN=0), so
    the rows name FlashAttention-2's published 2024 rates (attention=flash with the kernel set),
    and every block's attention kernel, forward and backward, context-parallel steps included, is
    timed by that set (``rescaled``) where the set measured the head dimension (128); other head
    dimensions keep the measured grid. A global batch of one micro-batch per pipeline keeps the
    lowering small; the kernels are those of the published configuration."""
    from marssim.plan import run as run_plan

    for r in load_published(table):
        assert FA2_2024 in r.system and "attention=flash" in r.workload, r.name
        system, graph = load_system(r.system), load_workload(r.workload)
        cfg = parse_parallel(r.parallel)
        one = re.sub(r"global_batch=\d+", f"global_batch={cfg.dp * cfg.micro_batch * cfg.pp}", r.parallel)
        cfg, graph = bind_parallel(parse_parallel(one), graph, system, r.name, micro_batch_given=True,
                                   batch_given=False)
        t = graph.meta["transformer"]
        ops = run_plan(cfg, graph, system, cost, how="estimate", memory_policy="ignore", detail=True).result.ops
        models = ops[ops.index.str.fullmatch(r"layers\.\d+\.attn\.core(?:\.grad)?")]["cost_model"]
        assert len(models) == 2 * t.layers, r.name
        if t.hidden // t.heads == 128:
            assert set(models) == {"rescaled"}, (r.name, set(models))
        else:
            assert "rescaled" not in set(models), (r.name, set(models))


def test_the_megatron_bridge_rows_keep_the_engines_attention_kernels():
    """Megatron-Bridge 25.11 runs Transformer Engine 2 with cuDNN's fused attention: its rows name
    no 2024 kernel set."""
    assert not any("attention_kernels=" in r.system for r in load_published("megatron-bridge-2511-fp8"))


MXFP8_TOKENS = {"B200 LLAMA3-8B 8 GPUs": 29521, "GB200 LLAMA3-8B 8 GPUs": 29789, "B200 LLAMA3.1-405B 128 GPUs": 624,
                "GB300 LLAMA3-8B 8 GPUs": 36108}
"""The summary's FP8-MX figures (tokens/s/GPU, in parentheses beside FP8-CS) of its dense rows with FSDP 0."""


def test_the_mxfp8_rows_are_the_fp8_cs_runs_with_the_mxfp8_recipe_and_their_own_figures():
    cs = {r.name: r for r in load_published("megatron-bridge-2511-fp8")}
    runs = load_published("megatron-bridge-2511-mxfp8")
    assert {r.name for r in runs} == set(MXFP8_TOKENS)
    for r in runs:
        ref = cs[r.name]
        assert (r.system, r.parallel) == (ref.system, ref.parallel)
        assert r.workload == ref.workload.replace("fp8_recipe=current", "fp8_recipe=mxfp8")
        gpus, gbs = len(load_system(r.system).accelerators), parse_parallel(r.parallel).global_batch
        assert gbs * 8192 / (r.measured_iteration_s * gpus) == pytest.approx(MXFP8_TOKENS[r.name], rel=1e-4)
        assert f"({MXFP8_TOKENS[r.name]} tokens/s/GPU)" in r.source
        assert r.measured_iteration_s > ref.measured_iteration_s  # FP8-MX ran slower than FP8-CS on every row
        t = load_workload(r.workload).meta["transformer"]
        assert (t.fp8_recipe, t.low_dtype) == ("mxfp8", "mxfp8")


BRIDGE_2604_TOKENS = {
    "GB300 LLAMA3-70B 64 GPUs MXFP8": 4864, "GB300 LLAMA3-70B 64 GPUs NVFP4": 7296,
    "GB200 LLAMA3-70B 64 GPUs MXFP8": 3712, "GB200 LLAMA3-70B 64 GPUs NVFP4": 4864, "H100 LLAMA3-70B 64 GPUs FP8": 1664,
    "GB300 LLAMA3.1-405B 256 GPUs FP8": 1024, "GB300 LLAMA3.1-405B 256 GPUs MXFP8": 960,
    "GB300 LLAMA3.1-405B 256 GPUs NVFP4": 1440, "GB200 LLAMA3.1-405B 256 GPUs FP8": 864,
    "GB200 LLAMA3.1-405B 256 GPUs MXFP8": 800, "GB200 LLAMA3.1-405B 256 GPUs NVFP4": 1184,
    "H100 LLAMA3.1-405B 1024 GPUs FP8": 328}
"""Megatron-Bridge's 26.04.01 summary, its dense Llama rows without Megatron FSDP (tokens/s/GPU)."""


def test_the_2604_rows_take_their_precision_s_recipe_settings_and_their_own_figures():
    """Each row's figure converts back to the published tokens/s/GPU; each precision carries its
    preset's settings (FP8: current scaling and FP8 parameters; MXFP8: MXFP8 block scaling; NVFP4:
    NVFP4 parameters and no TP communication overlap, which the scripts turn off for it); the 405B
    rows count the embedding and the loss in the split, the 70B rows do not; nothing pads the
    vocabulary."""
    runs = load_published("megatron-bridge-2604-fp8-fp4")
    assert {r.name for r in runs} == set(BRIDGE_2604_TOKENS)
    recipes = {"FP8": ("fp8", "current", "fp8"), "MXFP8": ("fp8", "mxfp8", "mxfp8"), "NVFP4": ("fp4", "", "fp4")}
    for r in runs:
        cfg = parse_parallel(r.parallel)
        gpus = len(load_system(r.system).accelerators)
        assert cfg.gpus == gpus
        assert cfg.global_batch * 8192 / (r.measured_iteration_s * gpus) == pytest.approx(
            BRIDGE_2604_TOKENS[r.name], rel=1e-4)
        assert f"({BRIDGE_2604_TOKENS[r.name]} tokens/s/GPU)" in r.source
        t = load_workload(r.workload).meta["transformer"]
        precision = r.name.rsplit(" ", 1)[1]
        assert (t.gemm_dtype, t.fp8_recipe, t.low_dtype) == recipes[precision]
        assert t.fp8_param_gather and t.vocab == 128256 and t.seq == 8192
        assert cfg.tp_comm_overlap == (cfg.tp > 1 and precision != "NVFP4")
        big = "405B" in r.name
        assert cfg.account_for_embedding == cfg.account_for_loss == big
        assert cfg.overlap_param_gather == (r.name != "GB200 LLAMA3.1-405B 256 GPUs NVFP4")  # the OOM workaround
    by_name = {r.name: parse_parallel(r.parallel) for r in runs}
    gb200 = by_name["GB200 LLAMA3.1-405B 256 GPUs NVFP4"]  # 126 + 2 over 16 x 8 chunks: the ends alone
    assert chunk_layers(126, gb200)[0] == (-1,) and chunk_layers(126, gb200)[-1] == (126,)


KNOWN_OVER = {"GB200 LLAMA3.1-405B 256 GPUs", "GB200 LLAMA3.1-405B 256 GPUs FP8"}
"""Published runs the memory check refuses although they ran (docs/validation.md says why)."""


@pytest.mark.parametrize("table", ["korthikanti2022-table5", "megatron-bridge-2511-fp8", "megatron-bridge-2511-mxfp8",
                                   "megatron-bridge-2604-fp8-fp4", "megatron-bridge-2604-moe",
                                   "megatron-bridge-2604-qwen3-235b", *NEMO_TABLES])
def test_the_memory_check_admits_the_published_training_runs(table):
    """What ran fits: every published training row's closed-form memory is within its GPU's
    capacity, with the gradient buffer and optimizer state in the types the runs kept them."""
    from marssim.parallel.memory import memory_estimate
    from marssim.parallel.partition import prepare_graph
    from marssim.plan import workload_sets_batch
    from marssim.specs import split_spec

    for r in load_published(table):
        if r.name in KNOWN_OVER:
            continue
        system, graph = load_system(r.system), load_workload(r.workload)
        cfg, graph = bind_parallel(parse_parallel(r.parallel), graph, system, r.name,
                                   micro_batch_given="micro_batch" in split_spec(r.parallel, named=False).params,
                                   batch_given=workload_sets_batch(r.workload))
        capacity = system.accelerator(system.accelerator_ids[0]).memory.capacity
        est = memory_estimate(prepare_graph(graph, cfg), cfg, capacity)
        assert est.fits, (r.name, est.peak(est.worst_stage) / 2**30, est.terms(est.worst_stage))


def test_korthikanti_table5_pairs_each_model_with_and_without_recomputation():
    runs = load_published("korthikanti2022-table5")
    assert len(runs) == 8
    by_model = {}
    for r in runs:
        by_model.setdefault(r.workload, []).append(r)
    assert len(by_model) == 4
    for pair in by_model.values():
        full = next(r for r in pair if "recompute=full" in r.parallel)
        present = next(r for r in pair if "recompute=selective" in r.parallel and "sp=true" in r.parallel)
        assert present.measured_iteration_s < full.measured_iteration_s  # what the paper reports


def test_a_prediction_states_its_error_and_where_the_time_went():
    run = PublishedRun("small", "dgx-a100-cluster:nodes=1", SMALL, "tp=2,pp=2,dp=2,micro_batch=1,global_batch=8",
                       0.01, "a test")
    p = predict(run, how="estimate")
    assert not p.problem and p.iteration_s > 0
    assert p.error == pytest.approx(p.iteration_s / 0.01 - 1)
    assert p.busy_s + p.bubble_s + sum(p.exposed_s.values()) == pytest.approx(p.iteration_s, rel=1e-9)
    assert p.hfu >= p.mfu > 0
    other = PublishedRun("small2", run.system, run.workload, run.parallel, p.iteration_s * 2, "a test")
    q = predict(other, how="estimate")
    s = summary([p, q])
    assert s["rows"] == 2 and s["worst_abs"] == pytest.approx(max(abs(p.error), 0.5))
    assert s["mean_abs"] == pytest.approx((abs(p.error) + 0.5) / 2)
    text = format_predictions([p, q])
    assert all(len(line) <= 120 for line in text.splitlines()) and "-50.0%" in text


def test_a_run_that_cannot_be_predicted_says_why():
    bad = PublishedRun("bad", "dgx-a100-cluster:nodes=1", SMALL, "tp=3", 1.0, "a test")
    p = predict(bad, how="estimate")
    assert p.problem and math.isnan(p.iteration_s)
    assert summary([p])["rows"] == 0


def test_bad_tables_are_refused_naming_the_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("name,system,workload,parallel,measured_iteration_s,source\nx,ring-8,resnet50,tp=1,fast,me\n")
    with pytest.raises(InputError) as info:
        load_published(path)
    assert info.value.path == "row 1.measured_iteration_s"
    path.write_text("name,system\nx,ring-8\n")
    with pytest.raises(InputError, match="missing workload"):
        load_published(path)
    with pytest.raises(InputError, match="korthikanti2022-table5"):
        load_published("no-such-table")


def test_the_cli_predicts_a_table_and_refuses_flags_that_do_not_apply(tmp_path, capsys):
    path = tmp_path / "t.csv"
    path.write_text("# a test table\nname,system,workload,parallel,measured_iteration_s,source\n"
                    f'small,dgx-a100-cluster:nodes=1,"{SMALL}","tp=2,pp=2,dp=2,micro_batch=1,global_batch=8",0.01,me\n')
    assert main(["validate", "--published", str(path), "--how", "estimate", "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "small" in out and "mean |error|" in out and (tmp_path / "o" / "published.csv").is_file()
    assert main(["validate", "--published", str(path), "--system", "ring-8"]) == 2
    assert "--system" in capsys.readouterr().err


def test_a_serving_table_is_told_by_its_columns_and_checked_by_row_and_column(tmp_path):
    path = tmp_path / "s.csv"
    row = f'x,dgx-h100-cluster:nodes=1,"{SMALL_SERVED}","replicas=1,tp=1",16,8,4,100,me\n'
    path.write_text("# a serving table\n" + SERVE_HEADER + row)
    (run,) = load_published(path)
    assert isinstance(run, PublishedServing) and (run.input_tokens, run.output_tokens, run.requests) == (16, 8, 4)
    path.write_text(SERVE_HEADER + row.replace(",16,8,4,", ",16,eight,4,"))
    with pytest.raises(InputError) as info:
        load_published(path)
    assert info.value.path == "row 1.output_tokens"
    path.write_text(SERVE_HEADER + row.replace(",100,me", ",-3,me"))
    with pytest.raises(InputError) as info:
        load_published(path)
    assert info.value.path == "row 1.measured_output_tokens_per_s"
    with pytest.raises(InputError, match="missing requests"):
        table_kind(SERVE_HEADER.strip().replace(",requests", "").split(","), "f.csv")
    with pytest.raises(InputError, match="got both"):
        table_kind(SERVE_HEADER.strip().split(",") + ["measured_iteration_s"], "f.csv")
    train = ["name", "system", "workload", "parallel", "measured_iteration_s", "source"]
    assert table_kind(train, "f.csv") is TableKind.TRAIN


def test_a_serving_prediction_is_the_served_tokens_over_the_run():
    run = PublishedServing("small", "dgx-h100-cluster:nodes=1", SMALL_SERVED, "replicas=1,tp=1", 16, 8, 6, 1000.0,
                           "a test")
    (p,) = predict_all([run], how="estimate")
    assert isinstance(p, ServingPrediction) and not p.problem and p.how == "simulate"
    assert p.output_tokens_per_s == pytest.approx(6 * 8 / p.duration_s, rel=1e-9)
    assert p.error == pytest.approx(p.output_tokens_per_s / 1000.0 - 1)
    assert 0 < p.ttft_s <= p.duration_s and p.tpot_s > 0
    text = format_predictions([p])
    assert "16/8" in text and "mean |error|" in text and all(len(line) <= 120 for line in text.splitlines())
    bad = PublishedServing("bad", "dgx-h100-cluster:nodes=1", SMALL_SERVED, "replicas=1,tp=3", 16, 8, 6, 1.0, "t")
    (q,) = predict_all([bad])
    assert q.problem and math.isnan(q.output_tokens_per_s) and summary([q])["rows"] == 0


def test_the_cli_predicts_a_serving_table(tmp_path, capsys):
    path = tmp_path / "s.csv"
    path.write_text(SERVE_HEADER + f'x,dgx-h100-cluster:nodes=1,"{SMALL_SERVED}","replicas=1,tp=1",16,8,4,100,me\n')
    assert main(["validate", "--published", str(path), "--out", str(tmp_path / "o")]) == 0
    out = capsys.readouterr().out
    assert "predicted by simulate" in out and "16/8" in out
    text = (tmp_path / "o" / "published.csv").read_text()
    assert "predicted_output_tokens_per_s" in text.splitlines()[0]


LATENCY_HEADER = SERVE_HEADER.strip() + ",request_rate,latency_statistic,measured_ttft_ms,measured_tpot_ms\n"


def test_a_latency_row_is_read_with_its_rate_and_statistic_and_refused_by_row_and_column(tmp_path):
    path = tmp_path / "s.csv"
    row = f'x,dgx-h100-cluster:nodes=1,"{SMALL_SERVED}","replicas=1,tp=1",16,8,4,,me,4,median,50,20\n'
    path.write_text(LATENCY_HEADER + row)
    (run,) = load_published(path)
    assert run.request_rate == 4 and not run.offline and run.statistic is LatencyStatistic.MEDIAN
    assert (run.measured_ttft_s, run.measured_tpot_s) == (pytest.approx(0.05), pytest.approx(0.02))
    assert math.isnan(run.measured_output_tokens_per_s) and run.has_latency
    path.write_text(LATENCY_HEADER + row.replace(",4,median,", ",inf,median,"))
    assert load_published(path)[0].offline
    bad = {"row 1.request_rate": row.replace(",4,median,", ",-1,median,"),
           "row 1.latency_statistic": row.replace(",median,", ",p90,"),
           "row 1.measured_ttft_ms": row.replace(",50,20", ",fast,20"),
           "row 1.measured_tpot_ms": row.replace(",50,20", ",50,0")}
    for key, text in bad.items():
        path.write_text(LATENCY_HEADER + text)
        with pytest.raises(InputError) as info:
            load_published(path)
        assert info.value.path == key and info.value.file == str(path), key
    path.write_text(LATENCY_HEADER + row.replace(",median,", ",,"))
    with pytest.raises(InputError, match="mean or median") as info:
        load_published(path)
    assert info.value.path == "row 1.latency_statistic"
    path.write_text(LATENCY_HEADER + row.replace(",median,50,20", ",,,"))
    with pytest.raises(InputError, match="got none") as info:
        load_published(path)
    assert info.value.path == "row 1.measured_output_tokens_per_s"


def test_an_online_prediction_takes_the_rows_statistic_of_the_requests_and_each_figures_error():
    from marssim.cost import default_cost_model
    from marssim.plan import serve_stream
    from marssim.serve.requests import Arrivals, Lengths, RequestSpec

    base = PublishedServing("online", "dgx-h100-cluster:nodes=1", SMALL_SERVED, "replicas=1,tp=1", 16, 8, 12,
                            math.nan, "t", request_rate=2.0, statistic=LatencyStatistic.MEDIAN,
                            measured_ttft_s=0.001, measured_tpot_s=0.0005)
    mean_row = replace(base, name="mean", statistic=LatencyStatistic.MEAN, measured_tpot_s=math.nan)
    offline = replace(base, name="offline", request_rate=math.inf, measured_output_tokens_per_s=1000.0,
                      measured_ttft_s=math.nan, measured_tpot_s=math.nan)
    cost = default_cost_model()
    p, m, o = predict_all([base, mean_row, offline], cost)
    assert not (p.problem or m.problem or o.problem)
    # the median over the requests, recomputed from the per-request records of the same run
    spec = RequestSpec(Arrivals("poisson", rate=2.0), Lengths("fixed", 16), Lengths("fixed", 8), 12)
    r = serve_stream(Deployment((parse_pool("replicas=1,tp=1"),)), load_model(SMALL_SERVED),
                     load_system("dgx-h100-cluster:nodes=1"), cost, spec).per_request
    ttft = r["first_token_s"] - r["arrival_s"]
    tpot = (r["finish_s"] - r["first_token_s"]) / (r["output_tokens"] - 1)
    assert p.ttft_stat_s == pytest.approx(float(np.median(ttft))) and p.tpot_stat_s == pytest.approx(np.median(tpot))
    assert m.ttft_stat_s == pytest.approx(float(ttft.mean())) and m.ttft_stat_s == pytest.approx(m.ttft_s)
    assert p.ttft_error == pytest.approx(p.ttft_stat_s / 0.001 - 1)
    assert p.tpot_error == pytest.approx(p.tpot_stat_s / 0.0005 - 1)
    assert math.isnan(m.tpot_error) and math.isnan(p.error)
    assert o.error == pytest.approx(o.output_tokens_per_s / 1e3 - 1)
    # 12 requests spread over ~6 s of Poisson arrivals take longer than the same requests sent at once
    span = float(r["arrival_s"].max() - r["arrival_s"].min())
    assert p.duration_s > o.duration_s and p.duration_s >= span > 1.0
    s = figure_summaries([p, m, o])
    assert (s["ttft"]["rows"], s["tpot"]["rows"], s["output_tokens_per_s"]["rows"]) == (2, 1, 1)
    assert s["tpot"]["mean_abs"] == pytest.approx(abs(p.tpot_error))
    assert s["ttft"]["mean"] == pytest.approx((p.ttft_error + m.ttft_error) / 2)
    text = format_predictions([p, m, o])
    assert all(len(line) <= 120 for line in text.splitlines()) and "TPOT" in text and " p50 " in text
    assert summary([p, m, o])["rows"] == 1  # the throughput error of the one row that publishes it


# The source's offline rows: request throughput (req/s) as the README's table publishes it
SGLANG_060_REQUESTS_PER_S = {"SGLang 70B 4xH100 inf": 19.84, "vLLM 70B 4xH100 inf": 19.04,
                             "SGLang 8B 1xA100 inf": 22.03, "vLLM 8B 1xA100 inf": 21.27}


def test_the_sglang_vllm_bf16_table_takes_its_output_length_from_its_offline_rows():
    """Every request of the table generates the mean output length its header derives: the
    offline rows' output tokens/s over their request throughput (both published), 194 tokens to
    within half a token; the online rows are Poisson at 4 or 8 requests/s with a median TTFT and
    TPOT each; every model in bf16."""
    runs = load_published("sglang-0.3.0-vllm-0.6.0-bf16-latency")
    assert len(runs) == 12 and all("dtype" not in r.model for r in runs)
    for r in runs:
        if r.offline:
            tokens = r.measured_output_tokens_per_s / SGLANG_060_REQUESTS_PER_S[r.name]
            assert tokens == pytest.approx(r.output_tokens, abs=0.5), r.name
            assert r.requests == 5000 and math.isnan(r.measured_tpot_s)
        else:
            assert r.request_rate in (4, 8) and r.requests == 300 * r.request_rate
            assert r.statistic is LatencyStatistic.MEDIAN and r.measured_ttft_s > 0 and r.measured_tpot_s > 0


def _round_up(x: float, step: int) -> int:
    return step * math.ceil(x / step)


def test_the_tensorrt_llm_rows_take_the_limits_trtllm_bench_computes_as_the_header_states():
    """max_num_seqs and max_batched_tokens of every TensorRT-LLM 1.0 row follow, independently
    recomputed here, the rule the table's header states (trtllm-bench's heuristic when its command
    gives neither): the cache's requests, rounded up, from the GPU's memory, the checkpoint's
    parameters, the preset's layers and key/value heads and the row's cache type and lengths."""
    memory_gib = {"H100": 81559 / 1024, "H200": 143771 / 1024}
    params = {"llama3-8b": 8.03e9, "llama3-70b": 70.55e9, "llama3-405b": 405.85e9}
    runs = load_published("trtllm-1.0-h100-h200-fp8-throughput")
    assert len(runs) == 36
    for r in runs:
        gpu = "H100" if "H100" in r.name else "H200"
        cfg = load_model(r.model)
        settings = dict(kv.split("=") for kv in r.deployment.split(","))
        tp = int(settings["tp"])
        kv_bytes = 1 if cfg.kv_dtype == "fp8" else 2
        per_token = 2 * cfg.layers * max(tp, cfg.kv_heads) * (cfg.hidden // cfg.heads) * kv_bytes / 2**30
        free = memory_gib[gpu] * tp - params[r.model.split(":")[0]] / 2**30
        requests = 0.95 * free / (per_token * (r.input_tokens + r.output_tokens))
        seqs = (max(64, _round_up(requests, 32)) if requests < 256 else
                _round_up(requests, 128) if requests < 1024 else _round_up(requests, 256))
        raw = min(requests * (1 + r.input_tokens / r.output_tokens), 32768)
        tokens = (max(2048, _round_up(raw, 256)) if raw < 4096 else
                  _round_up(raw, 512) if raw < 8192 else _round_up(raw, 1024))
        tokens = max(tokens, r.input_tokens + seqs)
        assert (int(settings["max_num_seqs"]), int(settings["max_batched_tokens"])) == (seqs, tokens), r.name


MOE_2604_TOKENS = {"GB300 QWEN3-30B-A3B 8 GPUs MXFP8": (31744, 8), "GB200 QWEN3-30B-A3B 8 GPUs MXFP8": (26112, 4),
                   "B300 QWEN3-30B-A3B 8 GPUs MXFP8": (30720, 8), "B200 QWEN3-30B-A3B 8 GPUs MXFP8": (27136, 4),
                   "H100 QWEN3-30B-A3B 16 GPUs FP8": (8960, 1)}
"""Megatron-Bridge's 26.04.01 Qwen3-30B-A3B rows: tokens/s/GPU and the micro-batch."""


def test_the_moe_rows_spread_the_experts_over_every_gpu_and_take_their_own_figures():
    """Each row's figure converts back to the published tokens/s/GPU; the experts are spread over
    all the GPUs (EP = GPUs, no tensor or pipeline parallelism), the routing uniform (the runs
    force it to balance), MXFP8 on the Blackwells and per-tensor current scaling on the H100."""
    runs = load_published("megatron-bridge-2604-moe")
    assert {r.name for r in runs} == set(MOE_2604_TOKENS)
    for r in runs:
        tokens, mbs = MOE_2604_TOKENS[r.name]
        cfg = parse_parallel(r.parallel)
        gpus = len(load_system(r.system).accelerators)
        assert (cfg.gpus, cfg.ep, cfg.tp, cfg.pp, cfg.micro_batch) == (gpus, gpus, 1, 1, mbs)
        assert cfg.global_batch * 4096 / (r.measured_iteration_s * gpus) == pytest.approx(tokens, rel=1e-4)
        assert f"({tokens} tokens/s/GPU)" in r.source
        t = load_workload(r.workload).meta["transformer"]
        assert (t.experts, t.top_k, t.expert_ffn, t.layers, t.vocab) == (128, 8, 768, 48, 151936)
        assert not t.expert_load and t.fp8_param_gather
        assert t.fp8_recipe == ("current" if r.name.startswith("H100") else "mxfp8")


QWEN3_235B_2604 = {"GB300 QWEN3-235B-A22B 256 GPUs MXFP8": (6944, 2, 1, 4, 12, 32),
                   "GB200 QWEN3-235B-A22B 256 GPUs MXFP8": (5680, 1, 1, 8, 3, 32),
                   "B300 QWEN3-235B-A22B 256 GPUs MXFP8": (5936, 2, 1, 8, 1, 8),
                   "B200 QWEN3-235B-A22B 256 GPUs MXFP8": (3776, 1, 1, 8, 1, 8),
                   "H100 QWEN3-235B-A22B 256 GPUs FP8": (1712, 1, 2, 8, 4, 32)}
"""Megatron-Bridge's 26.04.01 Qwen3-235B-A22B rows: tokens/s/GPU, MBS, TP, PP, VP (1: none) and EP."""


def test_the_qwen3_235b_rows_keep_each_expert_group_in_as_few_nvlink_domains_as_it_can():
    """Each row's figure converts back to the published tokens/s/GPU with its table's layout; the
    94 blocks plus the embedding and the loss fill the PP x VP chunks evenly; and in the row's rank
    order every expert-parallel group sits inside one NVLink domain (a DGX, or one NVL72 rack), as
    Megatron-LM's order places it -- the H100's group of 32 on the four DGX of its 32 consecutive
    ranks."""
    from marssim.parallel.placement import place

    runs = load_published("megatron-bridge-2604-qwen3-235b")
    assert {r.name for r in runs} == set(QWEN3_235B_2604)
    for r in runs:
        tokens, mbs, tp, pp, vp, ep = QWEN3_235B_2604[r.name]
        system = load_system(r.system)
        cfg, graph = bind_parallel(parse_parallel(r.parallel), load_workload(r.workload), system, r.name,
                                   micro_batch_given=True, batch_given=False)
        layout = (cfg.gpus, cfg.tp, cfg.pp, cfg.virtual_stages or 1, cfg.ep, cfg.micro_batch)
        assert layout == (256, tp, pp, vp, ep, mbs)
        assert cfg.etp_of(0) == 1  # whole experts on every rank (expert_tensor_parallel_size=1)
        assert cfg.global_batch * 4096 / (r.measured_iteration_s * 256) == pytest.approx(tokens, rel=1e-4)
        assert f"({tokens} tokens/s/GPU)" in r.source
        assert (94 + 2) % (pp * vp) == 0 and cfg.account_for_embedding and cfg.account_for_loss
        t = graph.meta["transformer"]
        assert (t.layers, t.hidden, t.experts, t.top_k, t.expert_ffn, t.kv_heads) == (94, 4096, 128, 8, 1536, 4)
        assert not t.expert_load and t.fp8_param_gather
        assert t.fp8_recipe == ("current" if r.name.startswith("H100") else "mxfp8")
        where = place(system, cfg)
        domains: dict[tuple, set] = {}
        for (dp, stage, t_rank), node in where.ranks.items():  # Megatron-LM's expert order: tp innermost
            domains.setdefault((stage, (t_rank + tp * dp) // ep), set()).add(system.cluster_node(system.nodes[node])[0])
        assert len(domains) == 256 // ep
        # inside one DGX or rack, except the H100's 32 expert ranks, which span four DGX
        assert all(len(d) == (4 if r.name.startswith("H100") else 1) for d in domains.values()), r.name
