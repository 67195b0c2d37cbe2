"""Fuzzing the parsers and the command line: any input ends in a result or one InputError (exit 2
at the command line), never another exception, and leaves no partial output behind.

Bounded (a fixed number of examples each, derandomised so that a run is repeatable) so that
the whole file runs in well under a minute. ``MARSSIM_FUZZ_EXAMPLES=N`` runs N random examples
per test instead (a longer search, different on each run)."""

from __future__ import annotations

import copy
import os
import time

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from marssim.cli import main
from marssim.data import topologies
from marssim.errors import InputError
from marssim.schema import parse_yaml, read_yaml

_EXPLORE = int(os.environ.get("MARSSIM_FUZZ_EXAMPLES", "0"))
FUZZ = settings(max_examples=_EXPLORE or 150, deadline=None, derandomize=not _EXPLORE, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
SLOW_FUZZ = settings(FUZZ, max_examples=_EXPLORE or 40)

# ------------------------------------------------------------------ values put where they do not belong
ODD_STRINGS = ["", " ", "0", "-1", "1e400", "nan", "inf", "1 GB/s", "400 GB/s", "-1 us", "1.5 us", "96 GiB",
               "1e400 GiB", "0 GiB", "{nodes}", "{x}", "acc[0-3]", "acc[5-2]", "acc[0-1000000]", "gpu", "os", "ws",
               "true", "yes", "~", "[", "*a", "&a", "a:b", "a=b,c", "\x00", "é", "ttft=1s", "h100", "fp8"]
SCALARS = st.one_of(st.none(), st.booleans(), st.sampled_from([-1, 0, 1, 2, 3, 7, 8, 64, 2**31, 2**63, 10**6]),
                    st.floats(allow_nan=True, allow_infinity=True), st.sampled_from(ODD_STRINGS),
                    st.text(max_size=12))
JUNK = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                     st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                    max_leaves=8)


def _paths(value, prefix=()):
    """Every key path inside ``value`` (dict keys and list indices)."""
    out = [prefix]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, prefix + (k,))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, prefix + (i,))
    return out


def _mutate(data, draw):
    """``data`` with one key path replaced by junk, removed, or given an unknown neighbour."""
    data = copy.deepcopy(data)
    path = draw(st.sampled_from(_paths(data)))
    if not path:
        return draw(JUNK)
    parent = data
    for part in path[:-1]:
        parent = parent[part]
    how = draw(st.sampled_from(["replace", "delete", "extra"]))
    if how == "replace":
        parent[path[-1]] = draw(JUNK)
    elif how == "delete":
        del parent[path[-1]]
    elif isinstance(parent, dict):
        parent[draw(st.text(min_size=1, max_size=8))] = draw(JUNK)
    else:
        parent.append(draw(JUNK))
    return data


def _result_or_input_error(fn, *args, **kwargs):
    try:
        return fn(*args, **kwargs)
    except InputError as err:
        assert str(err).strip(), "an InputError must say what is wrong"
        return err


# ------------------------------------------------------------------ YAML
YAML_TOKENS = st.sampled_from(["a", "b", ":", " ", "\n", "- ", "[", "]", "{", "}", ",", "&x ", "*x", "&y ", "*y",
                               "!!str ", "!!python/object:os.system ", "<<: ", "? ", "'", '"', "#", "---\n",
                               "...\n", "1", "1e9", "\t", "|\n  ", ">\n  ", "%YAML 1.1\n", "\\", "\x85"])


@FUZZ
@given(st.one_of(st.text(max_size=200), st.lists(YAML_TOKENS, max_size=60).map("".join)))
def test_any_yaml_text_parses_or_is_one_input_error(text):
    out = _result_or_input_error(parse_yaml, text, "f.yaml")
    if isinstance(out, InputError):
        assert str(out).startswith("f.yaml")


@FUZZ
@given(st.binary(max_size=200))
def test_any_bytes_as_a_yaml_file_parse_or_are_one_input_error(tmp_path_factory, data):
    path = tmp_path_factory.mktemp("y") / "f.yaml"
    path.write_bytes(data)
    _result_or_input_error(read_yaml, path)


@FUZZ
@given(st.integers(1, 12), st.integers(1, 12))
def test_alias_chains_of_any_width_and_depth_end_at_once(width, depth):
    lines = ["l0: &l0 [x, x]"] + [f"l{i}: &l{i} [{', '.join([f'*l{i - 1}'] * width)}]" for i in range(1, depth)]
    start = time.process_time()
    out = _result_or_input_error(parse_yaml, "\n".join(lines))
    assert time.process_time() - start < 1.0
    expanded = 2 * sum(width ** i for i in range(depth)) + sum(width ** i for i in range(1, depth)) + depth + 1
    assert isinstance(out, InputError) == (expanded > 1_000_000)


# ------------------------------------------------------------------ files: systems, mappings, deployments
RING = read_yaml(topologies() / "ring-8.yaml")
CLUSTER = read_yaml(topologies() / "dgx-h100-cluster.yaml")
CLUSTER["parameters"]["nodes"] = 2


@SLOW_FUZZ
@given(st.data())
def test_a_mutated_system_file_loads_or_is_one_input_error(data):
    from marssim.system.load import system_from_dict

    base = data.draw(st.sampled_from([RING, CLUSTER]))
    _result_or_input_error(system_from_dict, _mutate(base, data.draw), "sys.yaml")


MAPPING = read_yaml(topologies() / "mappings" / "mars-adaptive-16-resnet50.yaml")


@pytest.fixture(scope="module")
def mapping_inputs():
    from marssim.system import load_system
    from marssim.workload import load_workload

    return load_workload(MAPPING["workload"]), load_system(MAPPING["system"])


@SLOW_FUZZ
@given(st.data())
def test_a_mutated_mapping_file_loads_or_is_one_input_error(mapping_inputs, data):
    import warnings

    from marssim.mapping.io import mapping_from_dict

    graph, system = mapping_inputs
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _result_or_input_error(mapping_from_dict, _mutate(MAPPING, data.draw), graph, system, "m.yaml")


DEPLOYMENT = {"pools": [{"role": "prefill", "replicas": 1, "tp": 2, "scheduler": "chunked",
                         "max_batched_tokens": 512},
                        {"role": "decode", "replicas": 2, "tp": 1, "preemption": "swap", "swap_space": "2 GiB"}],
              "router": "round_robin", "decode_router": "least_tokens", "context_bucket": 4}


@FUZZ
@given(st.data())
def test_a_mutated_deployment_loads_or_is_one_input_error(data):
    from marssim.serve.deployment import deployment_from_dict

    _result_or_input_error(deployment_from_dict, _mutate(DEPLOYMENT, data.draw), "d.yaml")


# ------------------------------------------------------------------ spec strings
SPEC_PARTS = st.sampled_from(["resnet50", "llama3-8b", "gpt", "bert-base", "mode=train", "mode=serve", "seq=",
                              "batch=", "dtype=fp8", "dtype=x", "layers=2", "hidden=256", "heads=8", "tp=", "pp=",
                              "dp=", "micro_batch=", "global_batch=", "schedule=1f1b", "zero=3", ":", ",", "=", "0",
                              "1", "2", "-1", "1e9", "x", " ", "uniform:", "zipf:a=1.2,low=1,high=9", "poisson:rate=",
                              "gamma:rate=1,cv=", "offline", "trace:azure-conv-2023", "replicas=", "role=decode",
                              "swap_space=1GiB", "preemption=swap", "tokens=", "groups=", "share="])
SPECS = st.one_of(st.text(max_size=40), st.lists(SPEC_PARTS, max_size=10).map("".join))


@FUZZ
@given(SPECS)
def test_any_spec_string_parses_or_is_one_input_error(text):
    from marssim.parallel import parse_parallel
    from marssim.serve.deployment import parse_pool
    from marssim.serve.requests import parse_arrivals, parse_lengths, parse_prefix
    from marssim.serve.slo import parse_constraints
    from marssim.specs import split_spec

    for fn in (parse_parallel, parse_pool, parse_arrivals, parse_lengths, parse_prefix, parse_constraints,
               split_spec):
        _result_or_input_error(fn, text)


@SLOW_FUZZ
@given(SPECS)
def test_any_workload_spec_loads_or_is_one_input_error(text):
    from marssim.workload import load_workload

    # specs that parse to a full-size model are built (a fraction of a second each); the
    # parameters drawn are small, so nothing here builds for long
    _result_or_input_error(load_workload, text)


# ------------------------------------------------------------------ the command line
def _refused_on_one_line(argv: list[str], capsys) -> bool:
    """Run the command line: True when it refused the input (exit 2, one error line, no
    traceback), False when it ran (exit 0); anything else fails the test."""
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: a value of the wrong type
        code = exc.code
    err = capsys.readouterr().err.strip()
    assert code in (0, 2), err
    if code == 2:
        assert "error: " in err.splitlines()[-1] and "Traceback" not in err
    return code == 2


@pytest.fixture(scope="module")
def small_gpus(tmp_path_factory) -> str:
    """Four small GPUs on a switch (timed by the roofline: a run of a few requests is quick)."""
    path = tmp_path_factory.mktemp("sys") / "quad.yaml"
    path.write_text(yaml.safe_dump({
        "name": "quad",
        "designs": {"g8": {"dataflow": "gpu", "clock": "1 GHz", "sram": "8 MiB", "sram_bandwidth": "400 GB/s",
                           "gpu": {"sms": 8, "peak_flops": {"bf16": "50 TFLOP/s", "fp8": "100 TFLOP/s"}}}},
        "accelerators": [{"id": "acc[0-3]", "designs": ["g8"], "memory": {"capacity": "4 GiB",
                                                                         "bandwidth": "1 TB/s"}}],
        "hosts": [{"id": "host0", "dram": {"capacity": "1 TiB", "bandwidth": "200 GB/s"}}],
        "switches": [{"id": "sw0", "latency": "0.5 us"}],
        "links": [{"pattern": "star", "hub": "sw0", "nodes": "acc[0-3]", "bandwidth": "50 GB/s", "latency": "1 us"},
                  {"between": ["host0", "sw0"], "bandwidth": "32 GB/s", "latency": "1 us"}],
    }))
    return str(path)


FLAG_VALUES = {
    "--pool": st.sampled_from(["replicas=1,tp=1", "replicas=2,tp=2", "replicas=1,tp=1,swap_space=16",
                               "replicas=1,tp=1,preemption=swap,swap_space=1GiB", "replicas=9,tp=1", "tp=3",
                               "role=prefill,replicas=1,tp=1", "replicas=1,tp=1,scheduler=static", "x", ""]),
    "--prompt": st.sampled_from(["16", "uniform:8-32", "zipf:a=1.2,low=4,high=64", "0", "-3", "100000", "x",
                                 "trace:azure-conv-2023", ""]),
    "--output": st.sampled_from(["4", "uniform:1-8", "0", "1e9", "x"]),
    "--arrival": st.sampled_from(["poisson:rate=50", "gamma:rate=50,cv=2", "offline", "poisson:rate=0",
                                  "gamma:rate=1", "x"]),
    "--rate": st.sampled_from(["50", "0", "-1", "nan", "inf", "1e300"]),
    "--slo": st.sampled_from(["ttft=1s", "ttft=1", "ttft=1s,ttft=2s", "", "e2e=1 us", "x=1s"]),
    "--seed": st.sampled_from(["0", "7", "-1", "2e3", str(2**64)]),
    "--prefix": st.sampled_from(["tokens=8", "tokens=8,groups=2,share=0.5", "tokens=0", "share=2", "x"]),
    "--requests": st.sampled_from(["3", "0", "-2", "x"]),
    "--decode-router": st.sampled_from(["random", "x"]),
    "--workers": st.sampled_from(["1", "0"]),
    "--context-bucket": st.sampled_from(["1", "16", "0"]),
    "--model": st.sampled_from(["gpt:layers=2,hidden=256,heads=8,vocab=1000", "gpt:layers=2,hidden=256,heads=8,"
                                "vocab=1000,dtype=fp4", "llama:layers=1,hidden=128,heads=4,kv_heads=2,ffn=256,"
                                "vocab=500", "resnet50", "x"]),
}


@SLOW_FUZZ
@given(st.data())
def test_serve_flags_end_in_a_run_or_one_error_line_and_no_partial_output(small_gpus, tmp_path_factory, capsys,
                                                                          data):
    argv = ["serve", "--system", small_gpus, "--model", "gpt:layers=2,hidden=256,heads=8,vocab=1000", "--pool",
            "replicas=1,tp=1", "--arrival", "poisson:rate=50", "--prompt", "16", "--output", "4", "--requests", "3"]
    for flag in data.draw(st.lists(st.sampled_from(sorted(FLAG_VALUES)), max_size=4, unique=True)):
        value = data.draw(FLAG_VALUES[flag])
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    out = tmp_path_factory.mktemp("o") / "out"
    argv += ["--out", str(out)]
    if _refused_on_one_line(argv, capsys):
        assert not out.exists()
    else:
        assert (out / "summary.json").is_file()


PLAN_FLAGS = {
    "--strategy": st.sampled_from(["dp", "oc,dp", "head", "x", "", "dp,dp"]),
    "--micro-batches": st.sampled_from(["1", "2", "0", "-1", "x"]),
    "--batch": st.sampled_from(["1", "2", "0", "x"]),
    "--streams": st.sampled_from(["1", "2", "0", "5000"]),
    "--memory-policy": st.sampled_from(["error", "ignore", "spill", "x"]),
    "--group": st.sampled_from(["block", "stage", "x"]),
    "--parallel": st.sampled_from(["tp=8", "tp=2,dp=4", "x=1", ""]),
    "--trace-gpus": st.sampled_from(["acc0", "gpu0", "acc[0-3]", "x"]),
    "--workload": st.sampled_from(["resnet50:image=32", "resnet50:image=32,batch=2", "mobilenetv2:image=0",
                                   "gpt:layers=2,hidden=256,heads=8,vocab=1000,seq=64,mode=train", "x.onnx", ""]),
    "--system": st.sampled_from(["ring-8", "mars-adaptive-16", "dgx-h100-cluster:nodes=100000", "x"]),
}
PLAN_SWITCHES = ["--no-fold", "--estimate", "--per-op", "--no-report"]


@settings(FUZZ, max_examples=_EXPLORE or 20)
@given(st.data())
def test_plan_flags_end_in_a_result_or_one_error_line_and_no_partial_output(tmp_path_factory, capsys, data):
    verb = data.draw(st.sampled_from(["simulate", "estimate"]))
    argv = [verb, "--system", "ring-8", "--workload", "resnet50:image=32"]
    for flag in data.draw(st.lists(st.sampled_from(sorted(PLAN_FLAGS)), max_size=3, unique=True)):
        value = data.draw(PLAN_FLAGS[flag])
        if flag in argv:
            argv[argv.index(flag) + 1] = value
        else:
            argv += [flag, value]
    argv += data.draw(st.lists(st.sampled_from(PLAN_SWITCHES), max_size=2, unique=True))
    folder = tmp_path_factory.mktemp("o")
    outputs = {"--out": folder / "out", "--trace": folder / "t.json", "--intervals": folder / "i.csv"}
    for flag in data.draw(st.lists(st.sampled_from(sorted(outputs)), max_size=2, unique=True)):
        argv += [flag, str(outputs[flag])]
    if _refused_on_one_line(argv, capsys):
        assert sorted(folder.iterdir()) == []  # nothing written, not even a temporary file
    else:
        for flag, path in outputs.items():
            assert path.exists() == (flag in argv), flag
