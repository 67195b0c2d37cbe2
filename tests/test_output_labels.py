"""What a reader sees is labelled as what it is: no numpy reprs in messages, search notes as
JSON objects, a serving search's history in the serving figures, no energy stated where no
design has energy figures, and the parallel report's columns and interleaved stages defined."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pandas as pd

from support import RooflineCost, make_system

from marssim.errors import InputError, plain_reprs
from marssim.parallel.report import GROUP_NAMES, CATEGORIES, StageFigures, _legend
from marssim.search.report import _json_ready
from marssim.search.result import SearchResult


def test_numpy_scalars_read_as_plain_values_in_errors():
    err = InputError("plan.yaml", "pools[0].share", f"expected at most 1, got {np.float64(1.5)!r} "
                                                    f"of {np.int64(4)!r} ({np.True_!r})")
    assert str(err) == "plan.yaml: pools[0].share: expected at most 1, got 1.5 of 4 (True)"
    assert "np." not in plain_reprs(repr([np.float32(0.25), np.uint8(7)]))


def test_search_notes_keep_their_structure_in_json():
    notes = {"cache_hits": np.int64(3), "timing": {"screen_s": np.float64(0.5), "simulate_s": 1.25,
                                                   "simulations_s": math.nan}, "interrupted": True}
    ready = _json_ready(notes)
    back = json.loads(json.dumps(ready))
    assert back["timing"] == {"screen_s": 0.5, "simulate_s": 1.25, "simulations_s": None}
    assert back["cache_hits"] == 3 and back["interrupted"] is True


def _result(energy: float) -> SearchResult:
    from marssim.parallel import ParallelConfig

    e = SimpleNamespace(makespan=0.5, energy=energy, tpot=math.nan, mfu=0.4, throughput=1.0,
                        fitness=lambda objective: 0.5)
    return SearchResult("mars", "latency", ParallelConfig(tp=2), e, pd.DataFrame(), 3, 5, 1.0, 0, {}, [], 0)


def test_no_energy_stated_without_energy_figures():
    assert "energy" not in _result(0.0).summary()
    assert "energy 12 mJ" in _result(0.012).summary()


def test_every_communication_column_has_a_definition():
    assert set(GROUP_NAMES) == set(CATEGORIES) - {"bubble"}
    text = " ".join(_legend(["tp", "emb", "mp"]))
    assert "EMB: " in text and "MP: " in text and "TP: " in text
    assert all(len(line) <= 120 for line in _legend(list(GROUP_NAMES)))


def test_an_interleaved_stage_is_named_by_its_chunks():
    stage = StageFigures(1, (3, 11), 8, 0.0, 0.0, {}, {}, {}, chunks=((3, 5), (9, 11)))
    assert stage.layer_text(12) == "3-5/9-11"
    first = StageFigures(0, (-1, 2), 8, 0.0, 0.0, {}, {}, {}, chunks=((-1, 2),))
    assert first.layer_text(12) == "emb-2"
    last = StageFigures(3, (9, 12), 8, 0.0, 0.0, {}, {}, {}, chunks=((9, 12),))
    assert last.layer_text(12) == "9-head"


def test_a_serving_search_history_names_serving_figures():
    from marssim.search.serve import ServeSearchSettings, mars_serve
    from marssim.serve import Arrivals, Lengths, RequestSpec, load_model
    from marssim.serve.case import ServeCase
    from marssim.serve.slo import parse_constraints

    model = load_model("llama:layers=4,hidden=256,heads=8,kv_heads=4,ffn=768,vocab=2000")
    quad = make_system(4, topology="switch", capacity="64 MiB", bandwidth="50 GB/s", latency="1 us")
    spec = RequestSpec(Arrivals("poisson", rate=250.0), Lengths("uniform", low=20, high=600),
                       Lengths("uniform", low=2, high=120), 150)
    case = ServeCase(model, spec, 0, parse_constraints("ttft_p99=15ms,tbt_p99=3ms"), (), goodput=False)
    settings = ServeSearchSettings(objective="gpus", max_simulations=4, schedulers=("chunked",), max_num_seqs=(64,),
                                   max_batched_tokens=(512,), block_sizes=(16,), max_pp=1, population=4,
                                   generations=2, patience=2, grid_simulate=1)
    result = mars_serve(case, quad, RooflineCost(), settings)
    hist = result.history
    assert "best_makespan_s" not in hist.columns
    assert {"best_gpus", "best_rate_rps", "best_goodput_rps", "best_cost_per_mtok"} <= set(hist.columns)
    assert hist["best_gpus"].iloc[-1] == result.evaluation.gpus
