"""One spec grammar for systems, workloads and parallel configurations: the same mistake gets the
same error (the spec, the key, what was expected) wherever it is made, and the same words mean
the same values."""

from __future__ import annotations

import pytest

from marssim.errors import InputError
from marssim.parallel import parse_parallel
from marssim.specs import Field, coerce, format_spec, split_spec
from marssim.system import load_system
from marssim.workload import load_workload


def _error(fn, text: str) -> InputError:
    with pytest.raises(InputError) as info:
        fn(text)
    return info.value


# the same mistake made in a system spec, a workload spec and a parallel configuration
SITES = [
    (load_system, "dgx-h100-cluster:{}"),
    (load_workload, "gpt3-125m:{}"),
    (parse_parallel, "{}"),
]
KEY = {load_system: "nodes", load_workload: "batch", parse_parallel: "tp"}


@pytest.mark.parametrize("fn,template", SITES)
def test_a_non_integer_is_refused_alike_everywhere(fn, template):
    key = KEY[fn]
    text = template.format(f"{key}=x")
    err = _error(fn, text)
    assert err.file == (text if fn is not parse_parallel else "--parallel") and err.path == key
    assert str(err).endswith("expected a positive integer, got 'x'")


@pytest.mark.parametrize("fn,template", SITES)
def test_a_key_given_twice_is_refused_alike_everywhere(fn, template):
    key = KEY[fn]
    text = template.format(f"{key}=2,{key}=4")
    err = _error(fn, text)
    assert err.path == key and "given twice (2 and 4)" in str(err)


@pytest.mark.parametrize("fn,template", SITES)
def test_an_item_without_a_value_is_refused_alike_everywhere(fn, template):
    key = KEY[fn]
    text = template.format(f"{key}")
    err = _error(fn, text)
    assert err.path == key and "expected parameters as key=value pairs" in str(err)


@pytest.mark.parametrize("word,value", [("true", True), ("on", True), ("yes", True), ("1", True),
                                        ("false", False), ("off", False), ("no", False), ("0", False)])
def test_the_same_words_mean_true_and_false_everywhere(word, value):
    assert coerce("x", "k", word, Field("bool")) is value
    assert parse_parallel(f"tp=2,sp={word}").sp is value


def test_zero_or_nothing_is_not_a_silent_default():
    assert _error(parse_parallel, "tp=2,global_batch=0").path == "global_batch"
    assert "expected settings" in str(_error(parse_parallel, ""))
    assert "expected settings" in str(_error(parse_parallel, " "))


def test_ranges_and_choices_are_stated():
    err = _error(parse_parallel, "zero=4")
    assert err.path == "zero" and "an integer from 0 to 3" in str(err)
    err = _error(parse_parallel, "schedule=zigzag")
    assert "one of gpipe, 1f1b, interleaved" in str(err)
    err = _error(parse_parallel, "layers_per_stage=3/x")
    assert err.path == "layers_per_stage" and "one integer per stage" in str(err)


def test_split_and_format_are_inverse_and_canonical():
    spec = split_spec("dgx-h100-cluster:oversubscription=2,nodes=4")
    assert spec.name == "dgx-h100-cluster" and spec.params == {"oversubscription": "2", "nodes": "4"}
    assert format_spec(spec.name, spec.params) == "dgx-h100-cluster:nodes=4,oversubscription=2"
    assert split_spec("gpt3-125m").params == {}
    # a colon followed by a path belongs to the name (a file on another drive)
    assert split_spec("C:\\systems\\mine.yaml").name == "C:\\systems\\mine.yaml"
    assert split_spec("tp=8,pp=2", named=False).params == {"tp": "8", "pp": "2"}


def test_numbers_separated_by_slashes_round_trip() -> None:
    """``floats`` fields (a tuple default: the workload's ``expert_load``) take ``3/1/1.5``, refuse
    a non-number or a negative one naming the key, and print back in the same form."""
    from marssim.specs import coerce, field_like, format_spec

    field = field_like(())
    assert coerce("spec", "expert_load", "3/1/1.5", field) == (3.0, 1.0, 1.5)
    assert coerce("spec", "expert_load", [2, 1], field) == (2.0, 1.0)
    for bad in ("3/x", "1/-2", ""):
        with pytest.raises(InputError) as info:
            coerce("spec", "expert_load", bad, field)
        assert info.value.problems[0][0] == "expert_load"
    assert format_spec("moe", {"expert_load": (3.0, 1.0, 1.5)}) == "moe:expert_load=3/1/1.5"
