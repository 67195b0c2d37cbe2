"""Input that would be silently ignored is refused (flags that do not apply, a parameter given
twice) or warned about (a set that gets no ops)."""

from __future__ import annotations

import pytest
import yaml

from marssim.cli import main
from marssim.data import topologies
from marssim.errors import InputError, InputWarning
from marssim.mapping import load_mapping
from marssim.workload import load_workload

EXAMPLE = topologies() / "mappings" / "mars-adaptive-16-resnet50.yaml"


@pytest.mark.parametrize("flags", [["--strategy", "oc"], ["--micro-batches", "4"],
                                   ["--strategy", "oc", "--micro-batches", "4"]])
def test_flags_a_mapping_file_overrides_are_refused(flags, capsys):
    assert main(["simulate", "--mapping", str(EXAMPLE), *flags]) == 2
    err = capsys.readouterr().err
    assert flags[0] in err and "only without --mapping" in err and len(err.strip().splitlines()) == 1


def test_a_parameter_given_twice_is_refused():
    with pytest.raises(InputError) as info:
        load_workload("resnet50:batch=8,batch=2")
    assert info.value.path == "batch" and "given twice (8 and 2)" in str(info.value)


def test_a_set_without_ops_is_warned_about(tmp_path, capsys):
    data = {"system": "mars-adaptive-16", "workload": "resnet50:batch=2",
            "sets": [{"name": "busy", "devices": "acc[0-3]", "design": "os32"},
                     {"name": "idle", "devices": "acc[4-7]", "design": "os32"}],
            "assign": [{"ops": "*", "set": "busy", "sharding": "dp"}]}
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.warns(InputWarning, match=r"sets\[1\] \(idle\) gets no ops"):
        load_mapping(path)
    assert main(["simulate", "--mapping", str(path)]) == 0
    err = capsys.readouterr().err
    assert "marssim simulate: warning:" in err and "sets[1] (idle) gets no ops" in err


@pytest.mark.parametrize("algorithm, flags", [("h2h", ["--generations", "3"]), ("data_parallel", ["--budget", "5"]),
                                              ("random", ["--population", "4"]), ("random", ["--no-seed"])])
def test_search_flags_the_algorithm_would_ignore_are_refused(algorithm, flags, capsys):
    assert main(["search", "--system", "ring-8", "--workload", "resnet50:batch=2", "--algorithm", algorithm,
                 "--quiet", *flags]) == 2
    assert "would be ignored" in capsys.readouterr().err


# ------------------------------------------------------------------ every flag of a verb, in every mode
# Each verb's flags are classified per mode: they act there, or they are refused with one line
# naming them (run below); a flag may act with some values and be refused with others
# (--memory-policy spill). A flag added to a verb without a place in this table fails
# test_every_flag_is_classified_in_every_mode.
LLM = "gpt:layers=2,hidden=256,heads=8,vocab=1000"
MODES = {
    "per-op": ["--system", "ring-8", "--workload", "resnet50:batch=2"],
    "mapping-file": ["--mapping", str(EXAMPLE)],
    "parallel": ["--system", "dgx-h100-cluster:nodes=1", "--workload", f"{LLM},seq=128,mode=train", "--parallel",
                 "tp=8"],
    "serve": ["--system", "dgx-h100-cluster:nodes=1", "--model", LLM, "--pool", "replicas=1,tp=1", "--rate", "2",
              "--prompt", "16", "--output", "4", "--requests", "3"],
    "serve-offline": ["--system", "dgx-h100-cluster:nodes=1", "--model", LLM, "--pool", "replicas=1,tp=1",
                      "--arrival", "offline", "--prompt", "16", "--output", "4", "--requests", "3"],
    "serve-replay": ["--system", "dgx-h100-cluster:nodes=1", "--model", "llama3-8b", "--pool", "replicas=1,tp=1",
                     "--replay", "azure-conv-2023", "--requests", "3"],
    "serve-closed": ["--system", "dgx-h100-cluster:nodes=1", "--model", LLM, "--pool", "replicas=1,tp=1",
                     "--concurrency", "2", "--prompt", "16", "--output", "4", "--requests", "3"],
}
VERB_MODES = {"simulate": ("per-op", "mapping-file", "parallel"), "estimate": ("per-op", "mapping-file", "parallel"),
              "serve": ("serve", "serve-offline", "serve-replay", "serve-closed")}
_PLAN_ALWAYS = {"-h", "--mapping", "--system", "--workload", "--batch", "--parallel", "--per-op", "--group",
                "--no-report", "--allow-uncalibrated", "--out", "--trace", "--plot", "--intervals",
                "--per-link"}
_SERVE_ALWAYS = {"-h", "--system", "--model", "--deployment", "--pool", "--router", "--context-bucket", "--tp-comm",
                 "--requests", "--seed", "--slo", "--rates", "--out", "--trace", "--plot", "--allow-uncalibrated",
                 "--prefix"}
ACTS = {
    ("simulate", "per-op"): _PLAN_ALWAYS | {"--strategy", "--micro-batches", "--memory-policy", "--streams"},
    ("simulate", "mapping-file"): _PLAN_ALWAYS | {"--memory-policy", "--streams"},
    ("simulate", "parallel"): _PLAN_ALWAYS | {"--no-fold", "--trace-gpus", "--estimate", "--memory-policy"},
    ("estimate", "per-op"): _PLAN_ALWAYS | {"--strategy", "--micro-batches"},
    ("estimate", "mapping-file"): _PLAN_ALWAYS,
    ("estimate", "parallel"): _PLAN_ALWAYS | {"--no-fold", "--trace-gpus", "--memory-policy"},
    ("serve", "serve"): _SERVE_ALWAYS | {"--arrival", "--prompt", "--output", "--rate"},
    ("serve", "serve-offline"): _SERVE_ALWAYS | {"--arrival", "--prompt", "--output"},
    ("serve", "serve-replay"): _SERVE_ALWAYS | {"--replay", "--rate"},
    ("serve", "serve-closed"): _SERVE_ALWAYS | {"--concurrency", "--duration", "--prompt", "--output"},
}
# (verb, mode, flags given, the flag named in the one line of the error)
REFUSED = [
    *[(verb, mode, flags, flags[0]) for verb in ("simulate", "estimate") for mode in ("per-op", "mapping-file")
      for flags in (["--no-fold"], ["--trace-gpus", "gpu0", "--trace", "TRACE"])],
    ("simulate", "per-op", ["--estimate"], "--estimate"),
    ("simulate", "mapping-file", ["--estimate"], "--estimate"),
    ("estimate", "per-op", ["--memory-policy", "ignore"], "--memory-policy"),
    ("estimate", "mapping-file", ["--memory-policy", "ignore"], "--memory-policy"),
    *[(verb, "mapping-file", flags, flags[0]) for verb in ("simulate", "estimate")
      for flags in (["--strategy", "oc"], ["--micro-batches", "2"])],
    *[(verb, "parallel", flags, flags[0]) for verb in ("simulate", "estimate")
      for flags in (["--strategy", "dp"], ["--micro-batches", "2"], ["--trace-gpus", "gpu0"])],
    ("simulate", "parallel", ["--streams", "2"], "--streams"),
    ("simulate", "parallel", ["--memory-policy", "spill"], "--memory-policy"),
    *[("serve", mode, flags, flags[0]) for mode in ("serve", "serve-offline", "serve-replay", "serve-closed")
      for flags in (["--workers", "2"], ["--dask", "tcp://127.0.0.1:1"], ["--dask-timeout", "5"],
                    ["--decode-router", "random"])],
    ("serve", "serve-offline", ["--rate", "5"], "--rate"),
    ("serve", "serve-offline", ["--replay", "azure-conv-2023"], "--arrival"),
    ("serve", "serve", ["--replay", "azure-conv-2023"], "--prompt"),
    ("serve", "serve-replay", ["--prompt", "16"], "--prompt"),
    ("serve", "serve-replay", ["--output", "4"], "--output"),
    ("serve", "serve-replay", ["--arrival", "poisson:rate=2"], "--arrival"),
    ("serve", "serve", ["--concurrency", "2"], "--rate"),
    ("serve", "serve-offline", ["--concurrency", "2"], "--arrival"),
    ("serve", "serve-replay", ["--concurrency", "2"], "--replay"),
    *[("serve", mode, ["--duration", "5"], "--duration") for mode in ("serve", "serve-offline", "serve-replay")],
    ("serve", "serve-closed", ["--rate", "5"], "--rate"),
    ("serve", "serve-closed", ["--arrival", "poisson:rate=2"], "--arrival"),
    ("serve", "serve-closed", ["--replay", "azure-conv-2023"], "--replay"),
]


def _flags_of(verb: str) -> set[str]:
    from marssim.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.__class__.__name__ == "_SubParsersAction")
    return {a.option_strings[0] for a in sub.choices[verb]._actions if a.option_strings}


@pytest.mark.parametrize("verb", sorted(VERB_MODES))
def test_every_flag_is_classified_in_every_mode(verb):
    flags = _flags_of(verb)
    for mode in VERB_MODES[verb]:
        refused = {named for v, m, _, named in REFUSED if (v, m) == (verb, mode)}
        given = {flags_[0] for v, m, flags_, _ in REFUSED if (v, m) == (verb, mode)}
        missing = flags - ACTS[(verb, mode)] - given - refused
        assert not missing, f"{verb} in mode {mode}: flags neither acting nor refused: {sorted(missing)}"


@pytest.mark.parametrize("verb, mode, flags, named", REFUSED,
                         ids=[f"{v}-{m}-{f[0]}" for v, m, f, _ in REFUSED])
def test_a_flag_that_would_do_nothing_is_refused_in_one_line(verb, mode, flags, named, tmp_path, capsys):
    flags = [str(tmp_path / "t.json") if f == "TRACE" else f for f in flags]
    out = tmp_path / "out"
    assert main([verb, *MODES[mode], *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith(f"marssim {verb}: error: ") and named in err, err
    assert not out.exists() and not (tmp_path / "t.json").exists()
