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
