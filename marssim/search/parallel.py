"""Executors for candidate evaluation: serial, a local process pool, or a Dask cluster.

Any ``concurrent.futures.Executor`` works with :class:`~marssim.search.evaluate.Evaluator`;
this module opens the usual ones from command-line style settings and closes them after."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from concurrent.futures import Executor, ProcessPoolExecutor

__all__ = ["open_executor", "executor_parallelism", "ignore_interrupts", "stop_now", "worker_pool", "end_with_parent",
           "DASK_TIMEOUT"]


DASK_TIMEOUT = 10.0
"""Seconds to wait for a Dask scheduler to answer before giving up."""


@contextlib.contextmanager
def open_executor(workers: int | None = None, dask: str | None = None, *,
                  dask_timeout: float = DASK_TIMEOUT) -> Iterator[Executor | None]:
    """Yield the executor to evaluate candidates on, and shut it down afterwards.

    ``dask``: a Dask scheduler address (``tcp://host:8786``): the cluster's executor
    (``distributed.Client(address).get_executor()``; needs the ``[dask]`` extra), reached within
    ``dask_timeout`` seconds. Otherwise ``workers`` processes (default: the CPU count);
    ``workers=1`` yields None (serial, in this process). Raises ImportError naming the extra when
    ``distributed`` is missing, ConnectionError (one line: the address and the time waited) when
    the scheduler does not answer."""
    if dask:
        try:
            import distributed
        except ImportError as exc:  # pragma: no cover - depends on the environment
            raise ImportError("--dask needs the Dask extra: pip install 'marssim[dask]'") from exc
        try:
            client = distributed.Client(dask, timeout=dask_timeout)
        except (OSError, TimeoutError, ValueError) as exc:
            reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ConnectionError(f"no Dask scheduler answered at {dask} within {dask_timeout:g} s ({reason}); "
                                  "check the address, or wait longer with --dask-timeout") from None
        with client:
            yield client.get_executor()
        return
    n = workers or os.cpu_count() or 1
    if n <= 1:
        yield None
        return
    pool = worker_pool(n)
    try:
        yield pool
    except KeyboardInterrupt:
        stop_now(pool)
        raise
    pool.shutdown(wait=True)


def worker_pool(workers: int, ignore_ctrl_c: bool = True) -> ProcessPoolExecutor:
    """A pool of ``workers`` processes that ignore Ctrl-C (:func:`ignore_interrupts`; unless
    ``ignore_ctrl_c`` is False) and end when this process ends, however it ends (:func:`end_with_parent`: a process killed with
    SIGKILL leaves no worker computing on). Its processes are started at once, from the calling
    thread."""
    import multiprocessing
    import threading

    forked = multiprocessing.get_start_method(allow_none=False) == "fork"
    # the kernel's parent-death signal follows the thread that forked: asked for only when the
    # workers are forked here, now, by the main thread (whose end is the process's)
    kernel = forked and threading.current_thread() is threading.main_thread()
    pool = ProcessPoolExecutor(workers, initializer=_init_worker, initargs=(os.getpid(), kernel, ignore_ctrl_c))
    if forked:
        pool.submit(int).result()  # a forking pool starts every worker on its first task
    return pool


def _init_worker(parent: int, kernel: bool, ignore_ctrl_c: bool) -> None:
    if ignore_ctrl_c:
        ignore_interrupts()
    end_with_parent(parent, kernel)


def end_with_parent(parent: int, kernel: bool = True, period: float = 0.5) -> None:
    """Make this worker process end when ``parent`` (the process that started it) ends: on Linux
    the kernel's parent-death signal (``prctl(PR_SET_PDEATHSIG, SIGKILL)``, when ``kernel``),
    and everywhere a daemon thread that checks every ``period`` seconds whether the process has
    been given another parent, and then ends it."""
    import signal
    import sys
    import threading
    import time

    if kernel and sys.platform.startswith("linux"):
        with contextlib.suppress(OSError, AttributeError):
            import ctypes

            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # 1: PR_SET_PDEATHSIG
    if os.getppid() != parent:  # the parent ended before the signal was asked for
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period)
        os._exit(1)

    threading.Thread(target=watch, name="marssim-parent-watch", daemon=True).start()


def ignore_interrupts() -> None:
    """Worker initializer: Ctrl-C reaches every process of the terminal's group; only the parent
    acts on it (keeps the best so far, stops the workers), so the workers ignore it."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def stop_now(pool: ProcessPoolExecutor) -> None:
    """Stop ``pool`` at once: queued work cancelled, running workers terminated (a simulation of a
    minute is not waited for after Ctrl-C)."""
    processes = list(getattr(pool, "_processes", {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:
        with contextlib.suppress(Exception):
            process.terminate()


def executor_parallelism(executor: Executor | None, default: int = 8) -> int:
    """How many tasks ``executor`` runs at once: 1 for None, a process or thread pool's worker
    count, a Dask executor's total worker threads; ``default`` when it cannot be told."""
    if executor is None:
        return 1
    n = getattr(executor, "_max_workers", None)
    if n:
        return int(n)
    client = getattr(executor, "_client", None)
    if client is not None:
        with contextlib.suppress(Exception):
            workers = client.scheduler_info()["workers"].values()
            total = sum(int(w.get("nthreads", 1)) for w in workers)
            if total:
                return total
    return default
