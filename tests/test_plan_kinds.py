"""The registry of the kinds of plan (:mod:`marssim.plan.kinds`): every plan finds its kind, each kind's
names agree with the plan level's, its objectives are ones an evaluation ranks, its figures are
fields of an evaluation, its algorithms are what ``marssim search --algorithm`` offers, and a name
of another kind's algorithm is refused saying which kind it searches."""

from __future__ import annotations

import dataclasses
import math
import pickle
from dataclasses import replace

import pytest

from marssim.cli import build_parser
from marssim.errors import InputError
from marssim.mapping import Mapping
from marssim.parallel import ParallelConfig
from marssim.plan import KINDS, PlanKind, kind_of, plan_key, plan_text
from marssim.search.evaluate import (OBJECTIVES, SERVING_OBJECTIVES, DeploymentEvaluation, Evaluation,
                                     MappingEvaluation, ParallelEvaluation)
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


DONE = {PlanKind.MAPPING: MappingEvaluation(1.0, 2.0, energy=3.0),
        PlanKind.PARALLEL: ParallelEvaluation(1.0, 2.0, energy=3.0, mfu=0.5, serving=True, ttft=0.2, tpot=0.01),
        PlanKind.DEPLOYMENT: DeploymentEvaluation(1.0, 2.0, rate=4.0, goodput=4.0, gpus=2, cost_per_mtok=1.0,
                                                  slo_ratio=0.5, latency={"e2e_mean": 0.1})}
"""A feasible evaluation of each kind, every figure its objectives read given."""


def test_objectives_are_ranked_and_figures_are_fields_of_the_kinds_record():
    for kind, spec in KINDS.items():
        record = spec.evaluation
        assert record.kind is kind and issubclass(record, Evaluation)
        fields = {f.name for f in dataclasses.fields(record)}
        assert set(spec.metrics) <= fields, (kind, set(spec.metrics) - fields)
        done = DONE[kind]
        assert type(done) is record and done.kind is kind
        for objective in spec.objectives:
            assert math.isfinite(done.fitness(objective)), (kind, objective)
            assert done.fitness(objective) > 0 and not replace(done, feasible=False).fitness(objective) < math.inf
    # each record holds its own figures only
    records = [spec.evaluation for spec in KINDS.values()]
    own = [{f.name for f in dataclasses.fields(r)} - {f.name for f in dataclasses.fields(Evaluation)} for r in records]
    assert not own[0] & own[2] and not own[1] & own[2]
    assert DONE[PlanKind.PARALLEL].fitness("latency") == 0.01  # a serving configuration: per output token
    assert DONE[PlanKind.DEPLOYMENT].fitness("gpus") == pytest.approx(2 + 0.1 / 1.1, rel=1e-15)
    with pytest.raises(ValueError, match="deployment evaluation"):
        DONE[PlanKind.DEPLOYMENT].fitness("energy")


def test_evaluations_pickle_as_themselves():
    for done in DONE.values():
        again = pickle.loads(pickle.dumps(done))
        assert type(again) is type(done) and repr(again) == repr(done) and again.kind is done.kind
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
