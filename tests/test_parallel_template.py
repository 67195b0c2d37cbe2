"""A unit template's references (marssim/parallel/template.py): typed refs, their modes, and their
grouping by the unit they read, a ring's repeated steps expanded row by row."""

from __future__ import annotations

import numpy as np

from marssim.parallel.template import LAST, SAME, Ref, Steps, Template, template_edges


def test_a_reference_read_in_another_mode_keeps_a_last_one():
    same = Ref(3, (0, "B"), 7, SAME)
    last = Ref(3, (0, "B"), 7, LAST)
    assert same.as_mode(LAST) == last and last.as_mode(SAME) is last
    assert same.at_last() == last
    assert len({same, Ref(3, (0, "B"), 7, SAME)}) == 1  # equal references are one dependency


def test_references_grouped_by_the_unit_they_read_with_steps_expanded():
    """Rows 1, 2 read unit (0, F) of GPU 4; rows 3..5 are a ring's repeated steps, each reading
    the row before it on GPU 4's same unit (0, B); row 6 reads GPU 4's (0, B) again and row 7 the
    last micro-batch of GPU 5's (1, B)."""
    tpl = Template()
    f, b, b1 = (0, "F"), (0, "B"), (1, "B")
    tpl.ext = [(1, Ref(4, f, 10, SAME)), (2, Ref(4, f, 11, SAME)), (3, Steps(3, 4, b)), (6, Ref(4, b, 2, SAME)),
               (7, Ref(5, b1, 0, LAST))]
    template_edges(tpl)
    groups = {key: (rows.tolist(), read.tolist()) for key, rows, read in tpl.ext_groups}
    assert groups == {(4, f, SAME): ([1, 2], [10, 11]),
                      (4, b, SAME): ([3, 4, 5, 6], [2, 3, 4, 2]),
                      (5, b1, LAST): ([7], [0])}
    for _, rows, read in tpl.ext_groups:
        assert rows.dtype == np.int32 and read.dtype == np.int32
