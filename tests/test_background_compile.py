"""One background compile process at most per cache folder (mnngpu/jit.py's queue and lock).

Runs on a cold cache queue their kernels as batch files; only the run that takes the folder's
compile lock starts a process (`python -m mnngpu.jit`), which compiles every batch queued, those
of later runs included, and exits. These tests start short runs of a few small kernels against
a cache folder of their own, and count the live processes in /proc."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from mnngpu import jit
from tests.test_first_run import _install_copy
from tests.test_jit import _background_workers

pytestmark = pytest.mark.skipif(not Path("/proc/self/environ").exists() or os.name != "posix",
                                reason="needs /proc to count the processes, and flock")

# A short run: four kernels through jit.runnable, each called once (a stand-in on a cold cache);
# then exit, as `mnngpu run` does. (No "mnngpu" + ".jit" in it: the counting looks for that.)
LAUNCH = textwrap.dedent("""
    import json
    import numpy as np
    from mnngpu import jit
    from mnngpu.backends.cpu.kernels import fastmath
    from mnngpu.backends.cpu.ops import attention, norm, rope

    x, v, r = np.ones((3, 16), np.float32), np.ones(40, np.float32), np.ones((2, 16), np.float32)
    calls = [
        (norm.norm_rows, (x, np.ones(16, np.float32), np.zeros(0, np.float32), 1e-5, True, np.empty_like(x))),
        (fastmath.silu_times, (v, v, np.empty_like(v))),
        (attention.causal_softmax, (np.ones((4, 6), np.float32), 2, 3, 0)),
        (rope.rope_rotate_half, (np.ones((2, 2, 16), np.float32), r, r, 8, np.empty((2, 2, 16), np.float32))),
    ]
    found = [(jit.runnable(kernel, args), args) for kernel, args in calls]
    for function, args in found:
        function(*args)
    misses = sum(sum(kernel.stats.cache_misses.values()) for kernel, _ in calls)
    print(json.dumps({"standins": sum(isinstance(f, jit.Standin) for f, _ in found), "misses": misses}))
""")


def _env(cache: Path) -> dict:
    return {**os.environ, "NUMBA_CACHE_DIR": str(cache), jit.ENV_SWITCH: "1"}


def _start_run(cache: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", LAUNCH], env=_env(cache), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _finish(run: subprocess.Popen) -> dict:
    out, err = run.communicate(timeout=300)
    assert run.returncode == 0, err[-3000:]
    return {**json.loads(out.strip().splitlines()[-1]), "stderr": err}


def _run(cache: Path) -> dict:
    return _finish(_start_run(cache))


class _Counter:
    """Samples the background processes of a cache folder every 20 ms: the most alive at once,
    and every one seen."""

    def __init__(self, cache: Path):
        self.cache, self.most, self.seen = cache, 0, set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.is_set():
            alive = _background_workers(self.cache)
            self.most = max(self.most, len(alive))
            self.seen.update(alive)
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _wait_until_none(cache: Path, limit_s: float = 240) -> None:
    deadline = time.monotonic() + limit_s      # a bound on the wait, not a speed check
    while _background_workers(cache) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _background_workers(cache)


def _queue_files(cache: Path, pattern: str = "*") -> list[Path]:
    return sorted(cache.glob(f"kernels-*/{jit.QUEUE}/*/{pattern}"))


def test_quick_runs_on_a_cold_cache_start_one_process_and_a_warm_run_none(tmp_path):
    """The defect: three quick runs left five compile processes alive. Three runs at once, then one
    more while it may still compile: one process alive at most, and it ends by itself; then a run
    on the warm cache starts none and compiles nothing."""
    cache = tmp_path / "cache"
    counter = _Counter(cache)
    try:
        runs = [_start_run(cache) for _ in range(3)]
        reports = [_finish(run) for run in runs]
        reports.append(_run(cache))
        _wait_until_none(cache)
    finally:
        counter.stop()
    assert reports[0]["standins"] == 4                     # a cold cache: the twins ran
    assert "compiling kernels in the background" in reports[0]["stderr"]
    assert counter.seen, "no background process was started"
    assert counter.most == 1, counter.most
    queuing = [report for report in reports if report["standins"]]
    assert len(counter.seen) < len(queuing)       # a live process took the later runs' batches
    assert _queue_files(cache, "*.jobs") == [] and _queue_files(cache, "*.running") == []
    assert _queue_files(cache, "*.failed") == []

    counter = _Counter(cache)
    try:
        warm = _run(cache)
        time.sleep(1)      # a process it started at its exit would be alive now
    finally:
        counter.stop()
    assert warm["standins"] == 0 and warm["misses"] == 0
    assert "compiling" not in warm["stderr"]
    assert not counter.seen
    assert _queue_files(cache, "*.jobs") == []


def test_runs_that_find_the_lock_held_leave_their_jobs_to_its_holder(tmp_path):
    """While a process holds the lock (here the test, for a process that compiles), runs start
    none: they queue their batches; the holder's next look takes them all."""
    import fcntl

    cache = tmp_path / "cache"
    folder = cache / jit._KERNELS_FOLDER
    folder.mkdir(parents=True)
    with open(folder / jit.BACKGROUND_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for _ in range(2):
            assert _run(cache)["standins"] == 4
        time.sleep(0.5)
        assert _background_workers(cache) == []
        assert len(_queue_files(cache, "*.jobs")) == 2
        # a process started by hand meanwhile finds the lock held: it leaves the queue and exits
        subprocess.run([sys.executable, "-m", "mnngpu.jit"], env=_env(cache), timeout=120, check=True)
        assert len(_queue_files(cache, "*.jobs")) == 2
    # the lock's holder goes on: as the live process does, it compiles both batches
    done = subprocess.run([sys.executable, "-m", "mnngpu.jit"], env=_env(cache), capture_output=True, text=True,
                          timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _queue_files(cache, "*.jobs") == [] and _queue_files(cache, "*.failed") == []
    assert _run(cache)["standins"] == 0


HOLD_THE_LOCK = textwrap.dedent("""
    import fcntl, sys, time
    lock = open(sys.argv[1], "a")
    fcntl.flock(lock, fcntl.LOCK_EX)
    print("held", flush=True)
    time.sleep(600)
""")


def test_a_killed_process_blocks_no_later_compile(tmp_path):
    """A compile process killed outright (here one that holds the lock, with a batch half done)
    leaves its lock file, not its lock: flock dies with its holder. A run meanwhile starts none and
    leaves its batch queued; the next cold run starts a process, which takes both batches."""
    cache = tmp_path / "cache"
    folder = cache / jit._KERNELS_FOLDER
    folder.mkdir(parents=True)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_THE_LOCK, str(folder / jit.BACKGROUND_LOCK)],
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert _run(cache)["standins"] == 4
        assert _background_workers(cache) == [] and len(_queue_files(cache, "*.jobs")) == 1
        half_done = _queue_files(cache, "*.jobs")[0].with_name("1-1-1.running")    # the killed one's
        half_done.write_bytes(pickle.dumps([]))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()

    assert _run(cache)["standins"] == 4       # nothing compiled yet: this run starts a process
    _wait_until_none(cache)
    assert _queue_files(cache, "*.jobs") == [] and _queue_files(cache, "*.running") == []
    assert half_done.with_suffix(".failed").exists()    # for its run to see; deleted after STALE_AFTER
    after = _run(cache)
    assert after["standins"] == 0 and after["misses"] == 0


def test_a_process_that_ends_without_taking_its_batch_leaves_it_to_the_run(tmp_path, monkeypatch):
    """A process that could not even start (it left the batch queued, the lock free) is not started
    again and again: the run gives the batch up and compiles it itself."""
    monkeypatch.setattr(jit.numba.config, "CACHE_DIR", str(tmp_path / jit._KERNELS_FOLDER))

    def broken_start(lock, python=sys.executable, package=jit.PACKAGE):
        try:
            return subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"], pass_fds=(lock,))
        finally:
            os.close(lock)

    monkeypatch.setattr(jit, "_start_worker", broken_start)
    background = jit.Background(held=True)
    job = background.submit(jit.Job("mnngpu.nowhere", "kernel", sig=("float32",)))
    assert not background.done(job)
    (batch,) = background.batches
    assert batch.exists()
    deadline = time.monotonic() + 60
    while not background.done(job) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert background.done(job) and not batch.exists()
    assert len(background.workers) == 0 and background.drained == 1   # started once, not again


def test_another_installs_batches_go_to_its_own_process(tmp_path):
    """Two installs of one version (two venvs) share a kernels folder and its lock. The process of
    one compiles its own install's batches, then becomes the other install's process (exec, the lock
    held) for the rest (a process imports its own install's kernels only): one process at a time."""
    cache = tmp_path / "cache"
    other = _install_copy(tmp_path / "other") / "mnngpu"
    queues = {}
    for package in (jit.PACKAGE, other):
        queue = queues[package] = cache / jit._KERNELS_FOLDER / jit.QUEUE / jit._install_key(package)
        queue.mkdir(parents=True)
        (queue / "install.json").write_text(json.dumps({"python": sys.executable, "package": str(package)}))
        (queue / f"{time.time_ns():020d}-1-1.jobs").write_bytes(pickle.dumps([]))
    gone = cache / jit._KERNELS_FOLDER / jit.QUEUE / ("0" * 40)    # an install deleted since it queued
    gone.mkdir()
    (gone / "install.json").write_text(json.dumps({"python": sys.executable, "package": str(tmp_path / "gone")}))
    (gone / "1-1-1.jobs").write_bytes(pickle.dumps([]))

    counter = _Counter(cache)
    try:
        done = subprocess.run([sys.executable, "-m", "mnngpu.jit"], env=_env(cache), capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr[-3000:]
        _wait_until_none(cache)
    finally:
        counter.stop()
    assert _queue_files(cache, "*.jobs") == []           # the other install's process took its own:
    assert (cache / jit.INSTALLS / jit._install_key(other)).is_file()    # it ran, and recorded its install
    assert not gone.exists()
    assert counter.most <= 1


def test_a_notice_names_the_callers_line_not_jits():
    """Shown by Python's own warning printer, a CompileNotice points at the line outside mnngpu
    that met the new kernels, not at `self._announce()`."""
    background = jit.Background()
    background.unannounced.append(jit.Job("m", "kernel", sig=("float32",)))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        background.announce()
    (notice,) = caught
    assert notice.category is jit.CompileNotice
    assert notice.filename == __file__
    assert "announce()" in Path(__file__).read_text().splitlines()[notice.lineno - 1]
