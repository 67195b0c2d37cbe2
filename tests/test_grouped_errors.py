"""One error, one line: a problem repeated over many ops, devices or nodes is reported once, with
how many and which (a range in file order where they form one)."""

from __future__ import annotations

import copy

import pytest
import yaml

from marssim.cli import main
from marssim.errors import InputError, summarise_names
from marssim.mapping import load_mapping
from marssim.mapping.sharding import legal_strategies
from marssim.system import expand_ids, load_system, system_from_dict
from marssim.workload import load_workload

MAPPING = {"system": "mars-adaptive-16", "workload": "resnet50:batch=8",
           "sets": [{"name": "a", "devices": "acc[0-15]", "design": "os32"}],
           "assign": [{"ops": "conv1 .. fc", "set": "a", "sharding": "head"}]}


def _mapping_error(tmp_path, data: dict) -> InputError:
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(InputError) as info:
        load_mapping(path)
    return info.value


def test_an_illegal_sharding_over_a_range_is_one_line_naming_how_many(tmp_path):
    graph = load_workload("resnet50:batch=8")
    names = [graph.ops[gi].name for gi in graph.compute_ops]
    refusing = [n for n in names if "head" not in legal_strategies(graph.op(n))]
    assert len(refusing) > 30
    err = _mapping_error(tmp_path, MAPPING)
    assert len(err.problems) == 1 and len(str(err).splitlines()) == 1
    key, message = err.problems[0]
    assert key == "assign[0].sharding"
    assert f"{len(refusing)} ops ({refusing[0]} .. {refusing[-1]})" in message
    assert ", ".join(legal_strategies(graph.op(refusing[0]))) in message


def test_a_device_list_in_one_string_is_a_list():
    assert expand_ids("acc[0-3], acc12") == ["acc0", "acc1", "acc2", "acc3", "acc12"]
    with pytest.raises(ValueError, match="no spaces"):
        expand_ids("acc 3")


def test_unknown_devices_of_a_set_are_one_line(tmp_path):
    data = copy.deepcopy(MAPPING)
    data["sets"] = [{"name": "a", "devices": "acc[0-3], acc[20-25]", "design": "os32"},
                    {"name": "b", "devices": "acc[4-15]", "design": "os32"}]
    data["assign"] = [{"ops": "conv1 .. layer1.2.relu3", "set": "a"}, {"ops": "layer2.0.conv1 .. fc", "set": "b"}]
    err = _mapping_error(tmp_path, data)
    assert len(err.problems) == 1
    key, message = err.problems[0]
    assert key == "sets[0].devices" and "6 devices (acc20, acc21, acc22, acc23 and 2 more)" in message


def test_a_cut_off_group_of_nodes_is_one_line():
    ring = load_system("ring-8")
    data = yaml.safe_load(open(ring.path).read())
    # the first host loses every link: the eight chips and the other host stay together
    data["links"] = [link for link in data["links"] if "host0" not in (link.get("hub"), *(link.get("between") or []))]
    with pytest.raises(InputError) as info:
        system_from_dict(data, "ring.yaml")
    assert len(info.value.problems) == 1
    key, message = info.value.problems[0]
    assert key == "hosts[0].id" and "host host0 is not connected" in message and "tpu[0-7]" in message


def test_the_cli_prints_the_grouped_problem_once(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_text(yaml.safe_dump(MAPPING, sort_keys=False))
    assert main(["simulate", "--mapping", str(path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_summarised_names():
    assert summarise_names(["a", "b"]) == "a, b"
    assert summarise_names(list("abcdefg"), contiguous=True) == "a .. g"
    assert summarise_names(list("abcdefg")) == "a, b, c, d and 3 more"
