"""Tables never cut what they report: a long configuration continues on the next lines (or
its column widens), and joining the pieces gives back the whole text."""

from types import SimpleNamespace

from marssim.parallel import ParallelConfig
from marssim.search.report import short_config
from marssim.tables import wrap_last_cell

LONG = ParallelConfig(tp=8, pp=4, dp=9, sp=True, zero=1, recompute="full", global_batch=72, schedule="interleaved",
                      virtual_stages=5, order="tp-dp-pp", tp_comm_overlap=True, overlap_param_gather=True,
                      overlap_p2p_comm=True, cp=2, bucket=12345678)


def test_wrap_keeps_every_character_and_the_width():
    head = "x" * 70
    text = LONG.text()
    assert len(head) + len(text) > 120
    lines = wrap_last_cell(head, text, 120)
    assert len(lines) > 1
    assert all(len(line) <= 120 for line in lines)
    assert lines[0].startswith(head)
    assert all(line.startswith(" " * len(head)) for line in lines[1:])
    joined = "".join([lines[0][len(head):]] + [line[len(head):] for line in lines[1:]])
    assert joined.replace(" ", "") == text.replace(" ", "")
    assert "\u2026" not in "".join(lines)


def test_wrap_leaves_a_short_cell_on_one_line():
    assert wrap_last_cell("abc  ", "tp=8,pp=2", 120) == ["abc  tp=8,pp=2"]


def test_short_config_is_whole():
    text = short_config(LONG)
    assert "\u2026" not in text
    for token in ("tp8", "pp4", "dp9", "cp2", "il", "v5", "rc-full", "z1", "tp-dp-pp", "bucket12345678", "tpo", "opg",
                  "p2po"):
        assert token in text.split()


def test_systems_table_keeps_long_names_and_configurations():
    from marssim.cli.compare import systems_table

    system = "mixed-a100-h100-cluster:nodes_a100=2,nodes_h100=2"
    evaluation = SimpleNamespace(makespan=0.5, mfu=0.4, memory_peak=60 * 2**30)
    rows = [(system, 80 * 2**30, 1e6, SimpleNamespace(evaluation=evaluation, best=LONG)),
            ("gb200-nvl72:racks=1", 186 * 2**30, 1e6, SimpleNamespace(evaluation=evaluation, best=LONG.with_(cp=1)))]
    text = systems_table(rows)
    assert system in text
    assert "\u2026" not in text
    flat = "".join(line.strip() for line in text.splitlines())
    assert LONG.text() in flat.replace(" ", "")
