"""Hostile input ends in one InputError (exit 2) at once: YAML alias bombs, deep nesting, files
past their size limit, clusters and parallel configurations too large to build, LLMs on
accelerators that cannot run them, precisions a GPU lacks, prompts longer than the context."""

from __future__ import annotations

import time

import pytest
import yaml

from marssim import limits
from marssim.cli import main
from marssim.errors import InputError
from marssim.schema import parse_yaml, read_yaml
from marssim.system import load_system

ALIAS_BOMB = "\n".join(['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
                       + [f"{n}: &{n} [{','.join(['*' + p] * 9)}]" for p, n in zip("abcdefgh", "bcdefghi")]) + "\n"


def _one_line_exit_2(argv, capsys, *words) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    for w in words:
        assert w in err, err
    return err


def test_the_alias_bomb_is_refused_at_once_naming_its_line(tmp_path, capsys):
    assert len(ALIAS_BOMB) < 400  # 9 levels of 9 aliases: 9^9 = 387 million strings when expanded
    path = tmp_path / "bomb.yaml"
    path.write_text(ALIAS_BOMB)
    start = time.process_time()
    with pytest.raises(InputError) as info:
        read_yaml(path)
    assert time.process_time() - start < 1.0
    message = str(info.value)
    assert str(path) in message and f"more than {limits.MAX_YAML_NODES:,} values" in message
    # the line where the expansion passed the bound: 9^(level) values, past a million at level 7
    assert info.value.path.startswith("line 7,")
    for verb in (["show", str(path)], ["simulate", "--system", str(path), "--workload", "resnet50"]):
        _one_line_exit_2(verb, capsys, str(path), "aliases")


def test_aliases_within_the_bound_read_as_plain_yaml():
    text = "base: &b {x: 1, y: [1, 2]}\none: *b\ntwo: {<<: *b, x: 3}\n"
    assert parse_yaml(text) == yaml.safe_load(text)


@pytest.mark.parametrize("depth, refused", [(limits.MAX_YAML_DEPTH, False), (limits.MAX_YAML_DEPTH + 1, True),
                                            (5000, True)])
def test_nesting_is_bounded_without_recursion_error(depth, refused, tmp_path):
    path = tmp_path / "deep.yaml"
    path.write_text("[" * depth + "]" * depth + "\n")
    if not refused:
        value = read_yaml(path)
        for _ in range(depth - 1):
            value = value[0]
        assert value == []
        return
    with pytest.raises(InputError) as info:
        read_yaml(path)
    assert str(path) in str(info.value) and "line 1" in str(info.value)


@pytest.mark.parametrize("text, words", [
    ("a: &a [1, *a]\n", ["alias *a is inside the node it names"]),
    ("x: 1\ny: 2\nx: 3\n", ["line 3, column 1", "key 'x' given twice"]),
    ("a: !!python/object/apply:os.system [echo]\n", ["line 1", "not valid YAML"]),
    ("a: [1, 2\n", ["not valid YAML"]),
])
def test_yaml_that_is_not_plain_data_is_refused_with_its_line(text, words):
    with pytest.raises(InputError) as info:
        parse_yaml(text, "f.yaml")
    assert str(info.value).startswith("f.yaml: ")
    for w in words:
        assert w in str(info.value)


def test_a_yaml_file_past_the_size_limit_is_refused_before_it_is_parsed(tmp_path, capsys, monkeypatch):
    path = tmp_path / "huge.yaml"
    path.write_text("name: x\n" + "# padding\n" * 1000)
    size = path.stat().st_size
    monkeypatch.setattr("marssim.schema.MAX_YAML_BYTES", size - 1)
    with pytest.raises(InputError) as info:
        read_yaml(path)
    assert f"({size:,} bytes): larger than the 9.8 KiB ({size - 1:,} bytes) a YAML file may be" in str(info.value)
    monkeypatch.setattr("marssim.schema.MAX_YAML_BYTES", size)
    assert read_yaml(path) == {"name": "x"}


def test_a_file_whose_size_is_unknown_is_read_only_up_to_the_limit():
    with pytest.raises(InputError, match="more than the 4 MiB a YAML file may be"):
        read_yaml("/dev/zero")


@pytest.mark.parametrize("content, words", [
    (b"\xff\xfe\x00\x01", ["not a text file", "not UTF-8"]),
])
def test_a_binary_file_is_refused(tmp_path, content, words):
    path = tmp_path / "b.yaml"
    path.write_bytes(content)
    with pytest.raises(InputError) as info:
        read_yaml(path)
    for w in words:
        assert w in str(info.value)


def test_every_shipped_yaml_reads_as_before():
    from marssim.data import topologies

    files = sorted(topologies().rglob("*.yaml"))
    assert len(files) > 10
    for path in files:
        assert read_yaml(path) == yaml.safe_load(path.read_text()), path


@pytest.mark.parametrize("reader, limit_name, what", [
    ("marssim.serve.traces:load_trace", "MAX_CSV_BYTES", "a request trace"),
    ("marssim.cost.calibrated:load_table", "MAX_CSV_BYTES", "a calibration table"),
])
def test_tables_past_the_size_limit_are_refused(tmp_path, monkeypatch, reader, limit_name, what):
    import importlib

    module, name = reader.split(":")
    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n0,5,1\n")
    monkeypatch.setattr(f"marssim.limits.{limit_name}", 10)
    with pytest.raises(InputError, match=f"larger than the 10 bytes {what} may be"):
        getattr(importlib.import_module(module), name)(str(path))


@pytest.mark.parametrize("rows, key, words", [
    ("0,5,1\n1,5,1,9\n", "", ["line 3", "saw 4"]),
    ("0,5,1\n1,1e30,1\n", "row 2.prompt_tokens", ["below 2^31", "line 3"]),
    ("0,5,1\n1,5\n", "row 2.output_tokens", ["line 3"]),
])
def test_a_request_trace_of_the_wrong_shape_is_refused_with_its_line(tmp_path, rows, key, words):
    from marssim.serve.traces import load_trace

    path = tmp_path / "t.csv"
    path.write_text("arrival_s,prompt_tokens,output_tokens\n" + rows)
    with pytest.raises(InputError) as info:
        load_trace(str(path))
    assert info.value.path == key and "\n" not in str(info.value)
    for w in words:
        assert w in str(info.value)


def test_a_calibration_table_of_the_wrong_shape_is_refused_with_its_line(tmp_path):
    from marssim.cost.calibrated import REQUIRED_COLUMNS, load_table

    path = tmp_path / "t.csv"
    path.write_text("# provenance\n" + ",".join(REQUIRED_COLUMNS) + "\n1,2\n")
    with pytest.raises(InputError) as info:
        load_table(path)
    assert "line 3" in str(info.value) and f"expected {len(REQUIRED_COLUMNS)} cells like the header, got 2" in \
        str(info.value)


def test_a_cluster_too_large_to_build_is_refused_from_its_parameters():
    from marssim.system.cluster import MAX_CLUSTER_GPUS

    start = time.process_time()
    with pytest.raises(InputError) as info:
        load_system("dgx-h100-cluster:nodes=100000")
    assert time.process_time() - start < 1.0  # 800,000 GPUs take ~2 minutes to build: none is built
    assert f"800,000 GPUs (100,000 nodes x 8): more than {MAX_CLUSTER_GPUS:,}" in str(info.value)


def test_a_parallel_configuration_too_large_is_refused_before_the_system_is_built(capsys, monkeypatch):
    import marssim.system

    def never(*args, **kwargs):
        raise AssertionError("the system was built before the configuration's size was checked")

    monkeypatch.setattr(marssim.system, "load_system", never)
    _one_line_exit_2(["estimate", "--system", "dgx-h100-cluster:nodes=30000", "--workload",
                      "llama3-70b:mode=train,seq=4096", "--parallel", "tp=8,pp=2,dp=50000,global_batch=50000"],
                     capsys, "--parallel", "800,000 GPUs: more than 262,144")


SERVED_LLM = "gpt:layers=2,hidden=256,heads=8,vocab=1000"
SMALL_LLM = f"{SERVED_LLM},seq=128"


@pytest.mark.parametrize("argv", [
    ["simulate", "--system", "ring-8", "--workload", f"{SMALL_LLM},mode=train"],
    ["estimate", "--system", "ring-8", "--workload", f"{SMALL_LLM},mode=train"],
    ["search", "--system", "mars-adaptive-16", "--workload", f"{SMALL_LLM},mode=train", "--quiet"],
    ["compare", "--system", "mars-adaptive-16", "--workload", f"{SMALL_LLM},mode=train", "--quiet"],
    ["serve", "--system", "mars-adaptive-16", "--model", SERVED_LLM, "--pool", "replicas=1,tp=1", "--rate", "2",
     "--prompt", "16", "--output", "4", "--requests", "5"],
])
def test_an_llm_on_accelerators_that_are_not_gpus_is_refused_by_every_verb(argv, capsys):
    system = argv[argv.index("--system") + 1]
    _one_line_exit_2(argv, capsys, "--system", "is a large language model", f"the accelerators of {system} are not "
                                                                           "GPUs")


@pytest.mark.parametrize("argv, missing, has", [
    (["simulate", "--system", "dgx-a100-cluster:nodes=1", "--workload", f"{SMALL_LLM},mode=train,dtype=fp8",
      "--parallel", "tp=8"], "fp8", "fp16, bf16, tf32, int8, fp32"),
    (["estimate", "--system", "dgx-a100-cluster:nodes=1", "--workload", f"{SMALL_LLM},mode=train,dtype=fp8",
      "--parallel", "tp=8"], "fp8", "fp16, bf16, tf32, int8, fp32"),
    (["search", "--system", "dgx-h100-cluster:nodes=1", "--workload", f"{SMALL_LLM},mode=train,dtype=fp4",
      "--quiet"], "fp4", "fp16, bf16, tf32, fp8, int8, fp32"),
    (["serve", "--system", "dgx-h100-cluster:nodes=1", "--model", f"{SERVED_LLM},dtype=fp4", "--pool",
      "replicas=1,tp=1", "--rate", "2", "--prompt", "16", "--output", "4", "--requests", "5"], "fp4",
     "fp16, bf16, tf32, fp8, int8, fp32"),
])
def test_a_precision_the_gpu_lacks_is_refused_with_those_it_has(argv, missing, has, capsys):
    _one_line_exit_2(argv, capsys, f"computes in {missing}", f"they have {has}")


def test_a_prompt_longer_than_the_context_is_refused(capsys):
    # GPT-3's learned position table holds 2,048 positions
    _one_line_exit_2(["serve", "--system", "dgx-h100-cluster:nodes=1", "--model", "gpt3-125m", "--pool",
                      "replicas=1,tp=1", "--rate", "2", "--prompt", "2040", "--output", "9", "--requests", "3"],
                     capsys, "--prompt", "3 of 3 requests need more tokens than the model's context of 2,048",
                     "prompt 2,040 + output 9")


def test_an_output_file_in_a_place_that_cannot_hold_it_is_named_as_given(capsys):
    _one_line_exit_2(["cost", "resnet50", "--system", "mars-adaptive-16", "--csv", "/proc/x.csv"], capsys,
                     "/proc/x.csv", "--csv")
