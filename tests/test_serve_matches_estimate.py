"""One request served alone takes the estimate's times of the same steps: its time to first token
is the analytical estimate of the ``mode=prefill`` graph of its prompt, and each later token the
estimate of the ``mode=decode`` graph at its context, on every shipped GPU cluster. Both time a
replica's tensor-parallel collectives as the parallel lowering runs them (NCCL's plan of the group,
``marssim.collectives.group``), so they agree to rounding wherever the cluster's collective model
describes the group, not only where the links run at line rate. The estimate runs without the
parallel path's host launch gaps (``host_gaps=false``): a serving engine's iteration is timed
without host time (its decode steps run as CUDA graphs), see ``marssim.serve.engine``."""

from __future__ import annotations

import pytest

from marssim.parallel import parse_parallel
from marssim.plan import run
from marssim.plan.model import bind_parallel
from marssim.serve import Deployment, Pool, Requests, load_model
from marssim.serve.simulate import simulate_serving
from marssim.system import load_system
from marssim.workload import load_workload

SYSTEMS = ["dgx-a100-cluster:nodes=1", "dgx-h100-cluster:nodes=1", "dgx-h200-cluster:nodes=1",
           "dgx-b200-cluster:nodes=1", "gb200-nvl72:racks=1", "mi300x-cluster:nodes=1",
           "mixed-a100-h100-cluster"]
MODEL, TP, PROMPT, OUTPUT = "llama3-8b", 4, 300, 3


def _estimate(spec: str, system, cost) -> float:
    graph = load_workload(spec)
    gpus = len(system.accelerators)
    cfg, graph = bind_parallel(parse_parallel(f"tp={TP},dp={gpus // TP},host_gaps=false"), graph, system, "test",
                               micro_batch_given=False, batch_given=True)
    return run(cfg, graph, system, cost, how="estimate", detail=False).makespan


@pytest.mark.parametrize("name", SYSTEMS)
def test_a_request_alone_takes_the_estimate_of_its_prefill_and_decode_steps(name, cost):
    system = load_system(name)
    dep = Deployment((Pool(replicas=1, tp=TP),))
    served = simulate_serving(dep, load_model(MODEL), system, cost, Requests.of([0.0], [PROMPT], [OUTPUT]))
    first, finish = served.per_request["first_token_s"][0], served.per_request["finish_s"][0]
    prefill = _estimate(f"{MODEL}:mode=prefill,seq={PROMPT},batch=1", system, cost)
    # the k-th decode step reads the prompt and the k tokens generated so far (its own included)
    decodes = [_estimate(f"{MODEL}:mode=decode,context={PROMPT + k},batch=1", system, cost)
               for k in range(1, OUTPUT)]
    assert first == pytest.approx(prefill, rel=1e-9)
    assert finish - first == pytest.approx(sum(decodes), rel=1e-9)
