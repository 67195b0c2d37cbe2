"""The registry of the kinds of plan (:mod:`marssim.plan.kinds`): every plan finds its kind, each kind's
names agree with the plan level's, its objectives are ones an evaluation ranks, its figures are
fields of an evaluation, its algorithms are what ``marssim search --algorithm`` offers, and a name
of another kind's algorithm is refused saying which kind it searches."""

from __future__ import annotations

import dataclasses
import math

import pytest

from marssim.cli import build_parser
from marssim.errors import InputError
from marssim.mapping import Mapping
from marssim.parallel import ParallelConfig
from marssim.plan import KINDS, PlanKind, kind_of, plan_key, plan_text
from marssim.search.evaluate import OBJECTIVES, SERVING_OBJECTIVES, Evaluation
from marssim.search.runner import ALGORITHMS
from marssim.serve.deployment import Deployment, Pool
from marssim.system import load_system
from marssim.workload import load_workload


@pytest.fixture(scope="module")
def plans() -> dict[PlanKind, object]:
    graph, system = load_workload("resnet50:batch=2"), load_system("ring-8")
    return {PlanKind.MAPPING: Mapping.single_set(graph, system),
            PlanKind.PARALLEL: ParallelConfig(tp=2, pp=2, dp=2),
            PlanKind.DEPLOYMENT: Deployment((Pool(replicas=2, tp=2),))}


def test_every_plan_finds_its_kind_and_its_names_are_the_plan_levels(plans):
    for kind, plan in plans.items():
        spec = kind_of(plan)
        assert spec is KINDS[kind] and spec.kind is kind and isinstance(plan, spec.plan_type)
        assert spec.text(plan) == plan_text(plan) and spec.key(plan) == plan_key(plan)
    with pytest.raises(TypeError, match="not a plan"):
        kind_of("tp=2")


def test_objectives_are_ranked_and_figures_are_fields_of_an_evaluation():
    fields = {f.name for f in dataclasses.fields(Evaluation)}
    done = Evaluation(1.0, 2.0, 3.0, rate=4.0, goodput=4.0, gpus=2, cost_per_mtok=1.0, slo_ratio=0.5,
                      latency={"e2e_mean": 0.1})
    for spec in KINDS.values():
        assert set(spec.metrics) <= fields, spec.kind
        for objective in spec.objectives:
            assert math.isfinite(done.fitness(objective)), (spec.kind, objective)
    assert OBJECTIVES == KINDS[PlanKind.MAPPING].objectives
    assert SERVING_OBJECTIVES == KINDS[PlanKind.DEPLOYMENT].objectives
    assert set(KINDS[PlanKind.PARALLEL].objectives) <= set(OBJECTIVES)


def test_the_command_line_offers_exactly_the_kinds_algorithms():
    search = build_parser()._subparsers._group_actions[0].choices["search"]
    choices = next(a.choices for a in search._actions if a.dest == "algorithm")
    assert set(choices) == {a for spec in KINDS.values() for a in spec.algorithms}
    assert ALGORITHMS == KINDS[PlanKind.MAPPING].algorithms
    assert all(spec.default_algorithm == "mars" for spec in KINDS.values())


@pytest.mark.parametrize("kind,name,other", [(PlanKind.DEPLOYMENT, "h2h", "per-op mappings"),
                                             (PlanKind.MAPPING, "megatron_grid", "parallel configurations"),
                                             (PlanKind.PARALLEL, "uniform_grid", "serving deployments")])
def test_another_kinds_algorithm_is_refused_naming_that_kind(kind, name, other):
    KINDS[kind].check_algorithm("mars")
    with pytest.raises(InputError) as info:
        KINDS[kind].check_algorithm(name)
    text = str(info.value)
    assert text.startswith(f"--algorithm: {KINDS[kind].plural} are searched by ") and other in text


def test_a_configuration_runs_one_micro_batch_and_the_others_the_workload(plans):
    graph = load_workload("llama3-8b:mode=train,seq=128,batch=8,layers=2")
    cfg = ParallelConfig(tp=1, pp=1, dp=1, micro_batch=2, global_batch=8)
    assert KINDS[PlanKind.PARALLEL].graph_of(graph, cfg).batch == 2
    for kind in (PlanKind.MAPPING, PlanKind.DEPLOYMENT):
        assert KINDS[kind].graph_of(graph, plans[kind]) is graph
    assert KINDS[PlanKind.PARALLEL].affinity(cfg) and not KINDS[PlanKind.MAPPING].affinity(plans[PlanKind.MAPPING])
