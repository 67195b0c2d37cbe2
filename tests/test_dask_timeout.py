"""An unreachable Dask scheduler: the wait is the user's (--dask-timeout), then one line, exit 2."""

from __future__ import annotations

import pytest

from marssim.cli import main

pytest.importorskip("distributed")


def test_an_unreachable_scheduler_is_one_line_after_the_timeout_given(capsys):
    code = main(["search", "--system", "ring-8", "--workload", "resnet50:batch=2", "--quiet",
                 "--dask", "tcp://127.0.0.1:1", "--dask-timeout", "1"])
    err = capsys.readouterr().err.strip()
    assert code == 2
    assert len(err.splitlines()) == 1 and "tcp://127.0.0.1:1" in err and "within 1 s" in err
    assert "Traceback" not in err
    assert "after 1 s" in err  # Dask's own reason: the client waited the time given, not its default 30 s


def test_the_timeout_must_be_positive(capsys):
    with pytest.raises(SystemExit) as info:
        main(["search", "--system", "ring-8", "--workload", "resnet50:batch=2", "--dask", "tcp://x:1",
              "--dask-timeout", "0"])
    assert info.value.code == 2
