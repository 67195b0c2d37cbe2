"""The figures committed under analysis/figures/: a representative run of ResNet-50 (batch 8, four
micro-batches) on mars-adaptive-16, pipelined over its four boards with output-channel sharding
inside each board, coloured by layer; and three CNNs at once (mix-vision: ResNet-50, MobileNetV2, VGG-16, batch 4),
each on its own boards, coloured by model.

    PYTHONPATH=$PWD python analysis/make_figures.py

Writes ``<name>.png`` (Gantt chart), ``<name>-utilisation.png`` and ``<name>-memory.png``.
The ``demo-*.png`` figures beside them are what ``marssim demo`` writes (``--out``), copied.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _cases import SYSTEM, cost_model, run  # noqa: E402

from marssim.lower import lower  # noqa: E402
from marssim.mapping import Mapping  # noqa: E402
from marssim.mapping.systemref import canonical_system_ref  # noqa: E402
from marssim.mapping.model import AcceleratorSet  # noqa: E402
from marssim.mapping.sharding import legal_strategies  # noqa: E402
from marssim.sim import simulate  # noqa: E402
from marssim.system import load_system  # noqa: E402
from marssim.trace import plot_result  # noqa: E402
from marssim.workload import load_workload  # noqa: E402

OUT = Path(__file__).resolve().parent / "figures"


def per_model_mapping(graph, system) -> Mapping:
    """Each model on its own accelerators: ResNet-50 on board 0 (os32), MobileNetV2 on board 1
    (shi32), VGG-16, the heaviest, on boards 2 and 3 (ws32); output-channel sharding where legal,
    else data parallel; two micro-batches."""
    boards = [tuple(f"acc{i}" for i in range(lo, hi)) for lo, hi in ((0, 4), (4, 8), (8, 16))]
    sets = (AcceleratorSet(boards[0], "os32"), AcceleratorSet(boards[1], "shi32"), AcceleratorSet(boards[2], "ws32"))
    which = {"resnet50": 0, "mobilenetv2": 1, "vgg16": 2}
    ops = [graph.ops[i] for i in graph.compute_ops]
    sharding = tuple(next((s for s in ("oc", "dp") if s in legal_strategies(op)), "none") for op in ops)
    return Mapping(sets=sets, op_set=tuple(which[op.model] for op in ops), op_sharding=sharding, micro_batches=2,
                   system=canonical_system_ref(system), workload=graph.spec)


def main() -> None:
    result, cost_name = run("pipeline", batch=8, micro_batches=4)
    written = plot_result(result, OUT / "resnet50-pipeline.png", color_by="layer", formats=("png",))
    graph = load_workload("mix-vision:batch=4")
    system = load_system(str(SYSTEM))
    cost, _ = cost_model()
    mix = simulate(lower(graph, system, per_model_mapping(graph, system), cost), system)
    written += plot_result(mix, OUT / "mix-vision-per-model.png", color_by="model", formats=("png",))
    print(f"cost model: {cost_name}")
    print(f"resnet50 pipeline: makespan {result.makespan * 1e3:.3f} ms, {len(result.intervals)} intervals")
    print(f"mix-vision per model: makespan {mix.makespan * 1e3:.3f} ms, {len(mix.intervals)} intervals")
    for path in written:
        print(f"figure {path.relative_to(OUT.parent.parent)}")


if __name__ == "__main__":
    main()
