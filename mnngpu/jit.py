"""numba kernels that are ready at once, even on a machine that has never compiled them.

numba caches compiled kernels per machine (here, in the user's cache folder). On a cold cache the
CPU backend's kernels take tens of seconds to compile, so a first run would wait for them. Instead,
`runnable(kernel, args)` hands back a stand-in: the kernel's numpy twin (same arguments, same
results up to float rounding) runs while a background process compiles the kernel into the cache;
the compiled kernel takes over from the first call after that process is done. The tokenizer's
fast path does the same with `warm_up`, the library's own encoder standing in meanwhile.

The background process outlives a short run, so the next run finds a warm cache; when done, it
deletes the cached kernels no present install loads (prune_cache). Set
MNNGPU_BACKGROUND_COMPILE=0 to compile in the foreground instead (benchmarks and tests do).

One background process at most compiles for a cache folder, however many runs start meanwhile,
and none starts where the kernels are cached already. A run never hands its jobs to a process:
it writes them as a batch file in the folder's queue (background-jobs/<install>/), then starts
a process only if it can take the folder's compile lock (flock on background-compile.lock),
which it passes on to the process (an inherited file descriptor). A run that finds the lock
held starts nothing: the live process compiles every batch queued, those written while it
works included, lets go of the lock, looks at the queue once more (taking the lock again for
a batch that came in between) and exits. The OS lets go of a flock when its holder dies, so a
killed process blocks nothing: the next run to look finds the lock free and starts another. A
run counts a batch done when its file is gone; one that failed or whose process died compiles
in the run itself, as a failed job did before.

A CompileNotice (one line: how many kernels, for the first time) says when kernels go to the
background, as their batch is queued. It names the first line outside mnngpu that met them. A
caller that streams a reply can `hold_notices()` and say them with `announce()` where they split
nothing (the command line does, before its "ready" line and between replies).

    python -m mnngpu.jit      # the background process: compiles the queue, then exits
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import json
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np
from numba.core.caching import _CacheLocator
from numba.core.errors import NumbaPerformanceWarning

from mnngpu import mapped_folders

try:
    import fcntl
except ImportError:     # not POSIX: no compile lock
    fcntl = None

log = logging.getLogger("mnngpu.jit")

ENV_SWITCH = "MNNGPU_BACKGROUND_COMPILE"
BACKGROUND_LOCK = "background-compile.lock"


class CompileNotice(UserWarning):
    """Kernels started compiling in the background; slower stand-ins run until they are ready."""

    line_prefix = "note"   # the command line prints it as `note: ...`: nothing for the user to fix


warnings.filterwarnings("always", category=CompileNotice)   # each batch of kernels is news


def _user_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "mnngpu" / "numba"


def _cpu_backend_dir(package: Path) -> Path | None:
    """backends/cpu of the install whose package folder is `package` (mapped_folders)."""
    cpu = mapped_folders.folder("mnngpu.backends", package) / "cpu"
    return cpu if cpu.is_dir() else None


def _shared_sources_digest(package: Path) -> str:
    """A digest of the CPU kernels' sources (backends/cpu/kernels: intrinsics, fastmath, ...; and
    backends/cpu/ops, whose kernels call them).

    numba checks a cached kernel against its own source file only, but the kernels inline helpers
    from the other files there; after a change to one of those, the cache would still hand back
    the old machine code. Each version of the helpers gets a cache folder of its own instead."""
    digest = hashlib.sha256()
    cpu = _cpu_backend_dir(package)
    if cpu is not None:
        for source in sorted([*cpu.glob("kernels/*.py"), *cpu.glob("ops/*.py")]):
            digest.update(source.relative_to(cpu).as_posix().encode() + source.read_bytes())
    # the tokenizer's hash-table probe (bpe_model.int_slot), which unigram_lattice's kernels call too
    shared = package / "tokenizer" / "bpe_model.py"
    digest.update(shared.name.encode() + shared.read_bytes())
    return digest.hexdigest()[:12]


# Compiled kernels are cached in the user's cache, never next to an installed (maybe read-only)
# package. numba picks the place when a kernel is decorated, so every module with kernels
# imports this one first.
PACKAGE = Path(os.path.abspath(__file__)).parent   # as numba names it: abspath, links not followed
_KERNELS_FOLDER = f"kernels-{_shared_sources_digest(PACKAGE)}"
_base = Path(os.environ.get("NUMBA_CACHE_DIR") or _user_cache_dir())
numba.config.CACHE_DIR = str(_base if _base.name == _KERNELS_FOLDER else _base / _KERNELS_FOLDER)


def cache_dir() -> Path:
    return Path(numba.config.CACHE_DIR)


def background_allowed() -> bool:
    return os.environ.get(ENV_SWITCH, "1") != "0"


# ---- the installs a cache folder serves; pruning the kernels of the others -------------------
#
# The cache outlives installs: an upgrade leaves the old version's kernels-<digest> folder behind,
# and a second venv (or a deleted one) leaves its own numba folders, since numba names a source
# folder's cache after its absolute path. Each install that runs records its package folder under
# installs/; the background process deletes whatever no recorded, still-present install would load.

INSTALLS = "installs"
_KERNELS_NAME = re.compile(r"kernels-[0-9a-f]{12}")


def _cache_base() -> Path:
    return cache_dir().parent     # cache_dir() is always <base>/kernels-<digest>


def numba_folder(source_file: str | Path) -> str:
    """The folder inside cache_dir() where numba caches the kernels defined in `source_file`."""
    return _CacheLocator.get_suitable_cache_subpath(os.path.abspath(source_file))


def _numba_folders(package: Path) -> set[str]:
    """The numba cache folders of every source folder of the install whose package folder is `package`."""
    cpu = _cpu_backend_dir(package)
    roots = [package] + ([cpu.parent] if cpu is not None and package not in cpu.parents else [])
    return {numba_folder(Path(folder) / "any.py") for root in roots for folder, _, files in os.walk(root)
            if any(name.endswith(".py") for name in files)}


def _install_key(package: Path = PACKAGE) -> str:
    return hashlib.sha1(str(package).encode()).hexdigest()


def _register_install() -> None:
    """Record this install's package folder, once; a cache nobody may write to only goes unpruned."""
    record = _cache_base() / INSTALLS / _install_key()
    if record.exists():
        return
    try:
        record.parent.mkdir(parents=True, exist_ok=True)
        record.write_text(str(PACKAGE))
    except OSError:
        pass


_register_install()


def _live_folders() -> dict[str, set[str]]:
    """kernels-<digest> -> the numba folders in it that a recorded, still-present install loads.
    Records of installs that are gone are deleted on the way."""
    live = {_KERNELS_FOLDER: _numba_folders(PACKAGE)}
    for record in (_cache_base() / INSTALLS).glob("*"):
        package = Path(record.read_text())
        if not (package / "jit.py").is_file():
            record.unlink(missing_ok=True)
            continue
        live.setdefault(f"kernels-{_shared_sources_digest(package)}", set()).update(_numba_folders(package))
    return live


def prune_cache() -> list[Path]:
    """Delete the cache folders that no current install loads (a folder whose background process
    is still compiling is left alone); the folders deleted."""
    live = _live_folders()
    dead = []
    for folder in _cache_base().iterdir():
        if not (_KERNELS_NAME.fullmatch(folder.name) and folder.is_dir()):
            continue    # only our own folders: NUMBA_CACHE_DIR may be shared with other programs
        keep = live.get(folder.name)
        if keep is None:
            dead.append(folder)
        else:
            dead += [child for child in folder.iterdir() if child.is_dir() and child.name not in keep | {QUEUE}]
    for folder in dead:
        kernels_folder = folder if folder.parent == _cache_base() else folder.parent
        if kernels_folder.name == _KERNELS_FOLDER or not _compiling_in(kernels_folder):
            shutil.rmtree(folder, ignore_errors=True)
    return dead


def _compiling_in(kernels_folder: Path) -> bool:
    """Whether a background process holds this kernels folder's compile lock now."""
    if fcntl is None:
        return False
    try:
        with open(kernels_folder / BACKGROUND_LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(lock, fcntl.LOCK_UN)
    except BlockingIOError:
        return True
    except OSError:
        pass
    return False


def compile_now(kernel, sig: tuple) -> None:
    """Compile (or load from the cache) `kernel` for these argument types, in this process."""
    with warnings.catch_warnings():
        # one-thread kernels built with parallel=True for its faster loop code (linear_kernels.py)
        warnings.simplefilter("ignore", NumbaPerformanceWarning)
        kernel.compile(sig)


def is_cached(kernel, sig: tuple) -> bool:
    """Whether numba's cache holds `kernel` for `sig` on this machine, without loading it."""
    cache = getattr(kernel, "_cache", None)
    try:
        # no context.refresh(): the key needs the codegen only, and numba's typing and lowering
        # registries (a second and tens of MB) are loaded only where a kernel is
        key = cache._index_key(sig, kernel.targetctx.codegen())
        return key in cache._cache_file._load_index()
    except Exception:  # noqa: BLE001 -- a numba without these internals: compile in the foreground
        return True


# ---- the background process ------------------------------------------------------------------
#
# One process at a time compiles for a cache folder: the one that holds its compile lock (flock on
# BACKGROUND_LOCK, which the OS lets go of when the holder dies, however it dies). Runs never wait
# for it; they leave their jobs in the folder's queue, a file a batch:
#
#     <cache folder>/background-jobs/<install>/<time>-<pid>-<n>.jobs    queued
#                                              ....running              being compiled
#                                              ....failed               a job failed (the log says why)
#
# and only a run that finds the lock free starts a process, handing it the lock it took (an
# inherited file descriptor), so two runs never start two. The process compiles the batches of
# its install until none is left (a batch queued meanwhile included), lets go of the lock, looks
# once more, and exits. A run counts a batch done when its file is gone. Another install of this
# version (another venv) shares the folder and its lock but not its code: the process becomes
# that install's own process for its batches (exec, the lock held throughout), so never two run.

QUEUE = "background-jobs"
LOCK_FD = "MNNGPU_COMPILE_LOCK_FD"   # the lock a process is started with, inherited from its starter
CHECK_EVERY = 0.1                    # seconds between a run's looks at its batches (a stand-in asks per call)
STALE_AFTER = 3600                   # seconds: a dead run's failed batch, or a write cut short, is deleted


def _queue(key: str | None = None) -> Path:
    """The folder of the batches queued by the install `key` (this one by default)."""
    return cache_dir() / QUEUE / (key or _install_key())


def _queued_anywhere() -> bool:
    return any((cache_dir() / QUEUE).glob("*/*.jobs"))


def _batch_state(path: Path) -> str | None:
    """Where the batch queued as `path` (….jobs) is: ".jobs", ".running", ".failed", or None once done.
    A batch only moves on (jobs, running, then gone or failed), so looking in that order sees no
    step it has not taken."""
    for suffix in (".jobs", ".running", ".failed"):
        if path.with_suffix(suffix).exists():
            return suffix
    return None


def _write_atomic(path: Path, data: bytes) -> None:
    part = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    part.write_bytes(data)
    os.replace(part, path)


def _take_lock(wait_s: float = 0.0, fd: int | None = None) -> int | None:
    """A file descriptor holding this cache folder's compile lock, or None where a live process
    holds it (after `wait_s` of tries: another run's look at the lock holds it for microseconds).
    `fd`: the already open lock file to lock again. Without flock (not POSIX): -1, no lock."""
    if fcntl is None:
        return -1
    if fd is None:
        cache_dir().mkdir(parents=True, exist_ok=True)
        fd = os.open(cache_dir() / BACKGROUND_LOCK, os.O_RDWR | os.O_CREAT, 0o666)
        opened = True
    else:
        opened = False
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                if opened:
                    os.close(fd)
                return None
            time.sleep(0.01)


def _let_go(fd: int) -> None:
    if fd >= 0:
        os.close(fd)      # the last descriptor of the open lock file: the lock goes with it


def _worker_command(lock_fd: int, python: str, package: Path) -> tuple[list[str], dict[str, str]]:
    """(argv, environment) of the background process of the install whose package folder is `package`,
    handed the compile lock `lock_fd` (none where it is negative)."""
    # It must import that very package: `-m` puts the current folder first on the path, and from a
    # folder holding another mnngpu (a checkout) it would compile that one's kernels instead.
    path = os.pathsep.join(filter(None, [str(package.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir()), ENV_SWITCH: "0", "PYTHONPATH": path}
    env.pop(LOCK_FD, None)
    if lock_fd >= 0:
        env[LOCK_FD] = str(lock_fd)
    return [python, "-m", "mnngpu.jit"], env


def _start_worker(lock_fd: int, python: str = sys.executable, package: Path = PACKAGE) -> subprocess.Popen:
    """Start the background process of the install whose package folder is `package`, which takes
    over the compile lock `lock_fd` (this process lets go of its descriptor, started or not)."""
    try:
        argv, env = _worker_command(lock_fd, python, package)
        with open(_worker_log(), "ab") as log_file:
            # its own session: a Ctrl-C at the terminal stops the run, not the compile for the next one
            return subprocess.Popen(argv, stdin=subprocess.DEVNULL, cwd=cache_dir(), stdout=log_file,
                                    stderr=log_file, env=env, start_new_session=True,
                                    pass_fds=(lock_fd,) if lock_fd >= 0 else ())
    finally:
        _let_go(lock_fd)


def _flush_output() -> None:
    """Write out what the log and the standard streams hold, before the lock or the process goes."""
    for handler in logging.getLogger().handlers:
        handler.flush()
    sys.stdout.flush()
    sys.stderr.flush()


def _become_worker(lock_fd: int, python: str, package: Path) -> None:
    """Replace this background process by another install's, the lock held throughout: never two
    processes at once. Returns only where the exec fails (OSError)."""
    argv, env = _worker_command(lock_fd, python, package)
    if lock_fd >= 0:
        os.set_inheritable(lock_fd, True)
    _flush_output()
    os.chdir(cache_dir())
    os.execve(python, argv, env)


@dataclass(frozen=True)
class Job:
    """One unit of background work: compile `module.name` for `sig`, or call it with `args`."""
    module: str
    name: str
    sig: tuple = ()
    args: tuple = ()
    marker: str = ""          # a file the process writes in the cache folder once the job is done
                              # (under the numba folder of the code it warms: one per install)

    def run(self) -> None:
        target = getattr(importlib.import_module(self.module), self.name)
        if self.sig:
            compile_now(target, self.sig)
        else:
            target(*self.args)
        if self.marker:
            (cache_dir() / self.marker).parent.mkdir(parents=True, exist_ok=True)
            (cache_dir() / self.marker).touch()


@dataclass
class Background:
    """Jobs queued in this process, and their batches in the cache folder's queue until done."""
    queued: list[Job] = field(default_factory=list)
    batches: dict = field(default_factory=dict)   # path of a batch's .jobs file -> (its jobs, its number)
    workers: list = field(default_factory=list)   # (process, batches written by its start) this one started
    drained: int = 0                    # a process this one started has ended, holding the lock after
                                        # this many batches were written: they were its to take
    finished: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unannounced: list[Job] = field(default_factory=list)   # submitted, no CompileNotice yet
    announced_any: bool = False
    held: bool = False                  # notices wait for announce()
    written: int = 0                    # batches this process wrote (their names)
    next_look: float = 0.0              # time.monotonic() of the next look at the batches

    def submit(self, job: Job) -> Job:
        with self.lock:
            if job not in self.finished and job not in self.queued:
                self.queued.append(job)
                self.unannounced.append(job)
        return job

    def announce(self) -> None:
        """One CompileNotice for the jobs submitted since the last one, if any."""
        with self.lock:
            self._announce()

    def done(self, job: Job, start: bool = True) -> bool:
        """Whether `job` has run; with `start`, queues the jobs submitted by now for the background."""
        if job in self.finished:
            return True
        with self.lock:
            self._advance(start)
        return job in self.finished

    def start_leftovers(self) -> None:
        """At exit: jobs never queued still go to the background, and a batch whose process is gone
        gets one, so the next run is warm. A run that queued nothing touches nothing."""
        with self.lock:
            if self.queued:
                self._queue_batch()
            if self.batches:
                self._make_sure_a_worker_runs()

    def wait(self) -> None:
        """Block until every job queued so far has run (benchmarks time compiled kernels only)."""
        while True:
            with self.lock:
                self.next_look = 0.0
                self._advance()
                if not (self.queued or self.batches):
                    return
            time.sleep(CHECK_EVERY)

    def pending(self) -> bool:
        with self.lock:
            self._advance()
            return bool(self.queued or self.batches)

    def _advance(self, start: bool = True) -> None:
        self._reap()
        if self.batches and time.monotonic() >= self.next_look:
            self._look()
        if start and self.queued:
            if not self.held:
                self._announce()
            self._queue_batch()
            self._make_sure_a_worker_runs()

    def _reap(self) -> None:
        for process, written in self.workers:
            if process.poll() is not None:
                self.drained = max(self.drained, written)
        self.workers = [(process, written) for process, written in self.workers if process.returncode is None]

    def _queue_batch(self) -> None:
        jobs, self.queued = self.queued, []
        queue = _queue()
        self.written += 1
        path = queue / f"{time.time_ns():020d}-{os.getpid()}-{self.written}.jobs"
        try:
            queue.mkdir(parents=True, exist_ok=True)
            install = {"python": sys.executable, "package": str(PACKAGE)}
            _write_atomic(queue / "install.json", json.dumps(install).encode())
            _write_atomic(path, pickle.dumps(jobs))
        except OSError as exc:
            log.warning("cannot queue kernels for the background compile (%s); compiling in this process", exc)
            self.finished.update(jobs)
            return
        self.batches[path] = (jobs, self.written)
        self.next_look = time.monotonic() + CHECK_EVERY

    def _make_sure_a_worker_runs(self) -> None:
        """Start a background process unless one holds the lock (it takes what is queued)."""
        try:
            lock = _take_lock(wait_s=0.05)
            if lock is not None:
                self._hand_over(lock)
        except OSError as exc:
            self._give_up(f"cannot start the background compile ({exc})")

    def _hand_over(self, lock: int) -> None:
        """Holding the lock: start a process with it where anything is queued, else let go."""
        if _queued_anywhere():
            self.workers.append((_start_worker(lock), self.written))
        else:
            _let_go(lock)

    def _look(self) -> None:
        """Count the batches that are done. With the lock free: a batch whose process died on it (still
        running) or one that a process this one started left queued (it failed to start) is given
        up, to compile in this process; one still queued gets a process."""
        self.next_look = time.monotonic() + CHECK_EVERY
        try:
            lock = _take_lock() if fcntl is not None else None   # taken: no process compiles now
        except OSError:
            lock = None
        if lock is not None:
            self._reap()     # the processes this one started that held the lock: ended by now
        try:
            for path, (jobs, number) in list(self.batches.items()):
                state = _batch_state(path)
                if state == ".failed" or state is None:
                    pass
                elif lock is None or (state == ".jobs" and number > self.drained):
                    continue
                if state is not None:
                    log.warning("background compile %s; compiling in this process (see %s)",
                                {".failed": "failed", ".running": "died"}.get(state, "did not start"),
                                _worker_log())
                    path.with_suffix(state).unlink(missing_ok=True)
                self.finished.update(jobs)
                del self.batches[path]
        finally:
            if lock is not None:
                try:
                    self._hand_over(lock)
                except OSError as exc:
                    self._give_up(f"cannot start the background compile ({exc})")

    def _give_up(self, why: str) -> None:
        log.warning("%s; compiling in this process", why)
        for path, (jobs, _) in self.batches.items():
            path.unlink(missing_ok=True)
            self.finished.update(jobs)
        self.batches = {}

    def _announce(self) -> None:
        if self.unannounced:
            text = notice_text(self.unannounced, again=self.announced_any)
            self.unannounced, self.announced_any = [], True
            warnings.warn(text, CompileNotice, stacklevel=_caller_outside_mnngpu())


def _caller_outside_mnngpu() -> int:
    """warnings.warn's stacklevel, from _announce, of the first frame outside this package: the
    notice names the caller's line that met the new kernels (the command line prints one `note:`
    line and no source line at all), not a line of this module."""
    frame, level = sys._getframe(1), 1       # _announce's frame: stacklevel 1
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name != "mnngpu" and not name.startswith("mnngpu."):
            return level
        frame, level = frame.f_back, level + 1
    return 1


def notice_text(jobs: list[Job], again: bool = False) -> str:
    """`compiling kernels in the background: 12 this model needs for the first time, and the
    tokenizer's; ...`: what is compiling, in numbers (a warm_up job names its part)."""
    kernels = sum(1 for job in jobs if job.sig)
    parts = [f"{kernels}{' more' if again else ''} this model needs for the first time"] if kernels else []
    parts += [f"the {Path(job.marker).name.partition('-')[0]}'s" for job in jobs if job.marker]
    if not kernels:
        parts[-1] += ", for the first time"
    return (f"compiling kernels in the background: {', and '.join(parts)}; slower stand-ins run until they are "
            "ready")


def _worker_log() -> Path:
    return cache_dir() / "background-compile.log"


BACKGROUND = Background()
atexit.register(BACKGROUND.start_leftovers)


# ---- kernels and their numpy twins -----------------------------------------------------------

TWINS: dict = {}      # numba dispatcher -> numpy function with the same arguments


def twin_of(kernel) -> Callable:
    """Register the decorated numpy function as `kernel`'s stand-in while it compiles."""
    def register(function: Callable) -> Callable:
        TWINS[kernel] = function
        return function
    return register


class Standin:
    """Calls a kernel's numpy twin until the background compile of the kernel has finished."""

    __slots__ = ("compiled", "job", "kernel", "twin")

    def __init__(self, kernel, twin: Callable, job: Job):
        self.kernel, self.twin, self.job, self.compiled = kernel, twin, job, False

    def __call__(self, *args):
        if self.compiled:
            return self.kernel(*args)
        if BACKGROUND.done(self.job):
            compile_now(self.kernel, self.job.sig)      # a cache hit, unless the process failed
            self.compiled = True
            return self.kernel(*args)
        return self.twin(*args)


_STANDINS: dict[tuple, Standin] = {}


_RUNNABLE: dict[tuple, Callable] = {}   # (kernel, _type_key of the arguments) -> what runnable returned


def _type_key(arg):
    """A cheap stand-in for numba.typeof(arg): equal keys mean equal numba types (an array's
    class, dtype, dimensions, contiguity, writability and alignment), or None where it cannot tell."""
    if isinstance(arg, np.ndarray):
        flags = arg.flags
        return (type(arg), arg.dtype, arg.ndim, flags.c_contiguous, flags.f_contiguous, flags.writeable,
                flags.aligned)
    if isinstance(arg, tuple):
        keys = tuple(_type_key(item) for item in arg)
        return None if None in keys else (tuple, keys)
    if isinstance(arg, (bool, float, np.generic)):
        return type(arg)
    if isinstance(arg, int):
        return int, -(1 << 63) <= arg < (1 << 63)   # numba types the ints outside int64 differently
    return None


def runnable(kernel, args: tuple) -> Callable:
    """What to call to run `kernel` on arguments of these types: the kernel itself once compiled
    or cached; on a cold cache, a Standin that runs its numpy twin while it compiles. numba.typeof
    costs tens of microseconds an array, so the answer is kept per _type_key."""
    key = _type_key(args)
    found = _RUNNABLE.get((kernel, key)) if key is not None else None
    if found is None:
        found = _resolve(kernel, args)
        if key is not None:
            _RUNNABLE[(kernel, key)] = found
    return found


def _resolve(kernel, args: tuple) -> Callable:
    sig = tuple(numba.typeof(arg) for arg in args)
    if sig in kernel.overloads:
        return kernel
    standin = _STANDINS.get((kernel, sig))
    if standin is not None:
        return standin if not standin.compiled else kernel
    twin = TWINS.get(kernel)
    if twin is None or not background_allowed() or is_cached(kernel, sig):
        compile_now(kernel, sig)
        return kernel
    job = BACKGROUND.submit(Job(kernel.py_func.__module__, kernel.py_func.__name__, sig=sig))
    standin = _STANDINS[(kernel, sig)] = Standin(kernel, twin, job)
    return standin


def warm_up(name: str, key: str, function: Callable, make_args: Callable[[], tuple]) -> Callable[[], bool]:
    """A check of whether the kernels behind `function(*make_args())` are in the cache. When they may
    not be, that call is queued for the background process; the check turns True once it has run.
    `key` names everything the kernels depend on (a marker file in the cache records it).

    The marker lies in the numba folder of `function`'s source folder, as the kernels do: numba names
    that folder after the source's path, so the kernels another install (another venv) compiled
    are not taken as this one's."""
    digest = hashlib.sha256(f"{numba.__version__}|{key}".encode()).hexdigest()[:16]
    marker = f"{numba_folder(function.__code__.co_filename)}/{name}-{digest}.warm"
    if not background_allowed() or (cache_dir() / marker).exists():
        return lambda: True
    job = BACKGROUND.submit(Job(function.__module__, function.__name__, args=make_args(), marker=marker))
    # The check starts nothing: the first kernel stand-in starts one process for all the jobs
    # queued by then (the tokenizer is asked before the kernels are bound), or the exit does.
    return lambda: BACKGROUND.done(job, start=False)


def wait_for_compiles() -> None:
    """Block until the background process has compiled everything queued so far."""
    BACKGROUND.wait()


def hold_notices(held: bool = True) -> None:
    """While held, a CompileNotice waits for announce() instead of coming as its process starts."""
    BACKGROUND.held = held


def announce() -> None:
    """Say the CompileNotice of the kernels queued since the last one, if any (see hold_notices)."""
    BACKGROUND.announce()


def pending() -> bool:
    """Whether any kernel still runs as its twin (a background compile is queued or running)."""
    return BACKGROUND.pending()


def source_key(*modules) -> str:
    """A digest of these modules' sources: a marker made for other code is not taken as warm."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _work() -> int:
    """The background process: compile what this install's runs queued, then exit. Started
    holding the lock (LOCK_FD) or, started by hand, taking it; where another process holds it,
    that one takes the queue and this one exits at once."""
    inherited = os.environ.pop(LOCK_FD, None)
    lock = int(inherited) if inherited else _take_lock()
    if lock is None:
        return 0
    failed = 0
    while True:
        failed += _compile_queue()
        try:
            prune_cache()
        except Exception:  # housekeeping: the kernels are compiled, so the runs still take them
            log.exception("pruning the kernel cache failed")
        other = _other_install_waiting()
        if other is not None:   # another install (same kernels, another venv) queued: this process becomes its own
            try:
                _become_worker(lock, *other)
            except OSError:
                log.exception("starting the background compile of %s failed", other[1])
            break
        if lock < 0:
            break
        _flush_output()
        fcntl.flock(lock, fcntl.LOCK_UN)
        # a batch queued after the last look, by a run that found the lock still held: take it
        # again, unless a process another run started has it by now
        if not _queued_anywhere() or _take_lock(wait_s=0.05, fd=lock) is None:
            break
    _flush_output()
    # At once: the lock is free, and a run may start the next process; no second one lingers
    # through this interpreter's (numba's) slow teardown.
    os._exit(1 if failed else 0)


def _compile_queue() -> int:
    """Compile the batches this install queued, the oldest first, until none is left; how many
    jobs failed."""
    queue = _queue()
    _tidy(queue)
    failed = 0
    while batches := sorted(queue.glob("*.jobs")):
        for path in batches:
            running = path.with_suffix(".running")
            try:
                os.replace(path, running)
            except FileNotFoundError:
                continue     # without flock, another process took it
            try:
                jobs = pickle.loads(running.read_bytes())
            except Exception:  # an unreadable batch: the run that queued it compiles it itself
                log.exception("background compile batch %s unreadable", path.name)
                jobs, bad = [], 1
            else:
                bad = 0
            for job in jobs:
                try:
                    job.run()
                except Exception:  # one failed job leaves the rest to run; the log says why
                    log.exception("background compile of %s.%s failed", job.module, job.name)
                    bad += 1
            if bad:
                failed += bad
                os.replace(running, path.with_suffix(".failed"))
                os.utime(path.with_suffix(".failed"))
            else:
                running.unlink()
    return failed


def _tidy(queue: Path) -> None:
    """Holding the lock: a batch left running was a dead process's (failed, for its run to see);
    failed batches no run came for and writes cut short go after STALE_AFTER."""
    for path in queue.glob("*.running") if fcntl is not None else ():
        os.replace(path, path.with_suffix(".failed"))
        os.utime(path.with_suffix(".failed"))
    for path in [*queue.glob("*.failed"), *queue.glob("*.tmp")]:
        try:
            if path.stat().st_mtime < time.time() - STALE_AFTER:
                path.unlink()
        except OSError:
            pass


def _other_install_waiting() -> tuple[str, Path] | None:
    """(python, package folder) of another install with batches queued in this cache folder; the
    queues of installs that are gone are deleted on the way."""
    folder = cache_dir() / QUEUE
    for queue in folder.iterdir() if folder.is_dir() else ():
        if queue.name == _install_key() or not any(queue.glob("*.jobs")):
            continue
        try:
            install = json.loads((queue / "install.json").read_text())
            python, package = install["python"], Path(install["package"])
        except (OSError, ValueError, KeyError, TypeError):
            python, package = "", Path()
        if python and Path(python).is_file() and (package / "jit.py").is_file():
            return python, package
        shutil.rmtree(queue, ignore_errors=True)
    return None


if __name__ == "__main__":
    logging.basicConfig()
    sys.exit(_work())
