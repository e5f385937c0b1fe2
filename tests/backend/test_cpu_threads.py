"""The CPU backend's prefill worker pool when the calling thread is interrupted (Ctrl-C in a forward)."""

from __future__ import annotations

import threading

import pytest

from mnngpu.backends.cpu.device import WorkerPool

WAIT_S = 60  # bounds on waits that end at once; nothing here is timed


def test_an_interrupted_parallel_hands_out_no_more_tiles_and_the_next_waits_for_the_running_one():
    pool = WorkerPool(2)
    main = threading.current_thread()
    worker_busy, release = threading.Event(), threading.Event()
    done: list[int] = []

    def first(index: int) -> None:
        if threading.current_thread() is main:
            assert worker_busy.wait(WAIT_S)
            raise KeyboardInterrupt
        worker_busy.set()
        release.wait(WAIT_S)
        done.append(index)

    with pytest.raises(KeyboardInterrupt):
        pool.parallel(first, 8)
    seen_by_next: list[list[int]] = []
    releaser = threading.Timer(0.2, release.set)
    releaser.start()
    pool.parallel(lambda index: seen_by_next.append(list(done)), 2)
    releaser.join(WAIT_S)
    assert len(done) == 1  # only the tile that was running when the caller left
    assert all(seen == done for seen in seen_by_next)  # the next op began after it had finished
