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

A CompileNotice (one line: how many kernels, for the first time) says when kernels go to the
background, as their process starts. A caller that streams a reply can `hold_notices()` and
say them with `announce()` where they split nothing (the command line does, before its
"ready" line and between replies).

    python -m mnngpu.jit < jobs.pickle      # the background process: compiles, then exits
"""

from __future__ import annotations

import atexit
import hashlib
import importlib
import logging
import os
import pickle
import re
import shutil
import subprocess
import sys
import threading
import warnings
from collections.abc import Callable
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numba
import numpy as np
from numba.core.caching import _CacheLocator
from numba.core.errors import NumbaPerformanceWarning

from mnngpu import mapped_folders

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


def _register_install() -> None:
    """Record this install's package folder, once; a cache nobody may write to only goes unpruned."""
    record = _cache_base() / INSTALLS / hashlib.sha1(str(PACKAGE).encode()).hexdigest()
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
            dead += [child for child in folder.iterdir() if child.is_dir() and child.name not in keep]
    for folder in dead:
        kernels_folder = folder if folder.parent == _cache_base() else folder.parent
        if kernels_folder.name == _KERNELS_FOLDER or not _compiling_in(kernels_folder):
            shutil.rmtree(folder, ignore_errors=True)
    return dead


def _compiling_in(kernels_folder: Path) -> bool:
    """Whether a background process holds this kernels folder's compile lock now."""
    try:
        import fcntl
    except ImportError:
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
    """Jobs queued in this process, and the one background process that runs them in order."""
    queued: list[Job] = field(default_factory=list)
    running: tuple | None = None        # (Popen, jobs)
    finished: set = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)
    unannounced: list[Job] = field(default_factory=list)   # submitted, no CompileNotice yet
    announced_any: bool = False
    held: bool = False                  # notices wait for announce()

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
        """Whether `job` has run; with `start`, starts the queued jobs when no process is running."""
        if job in self.finished:
            return True
        with self.lock:
            self._advance(start)
        return job in self.finished

    def start_leftovers(self) -> None:
        """At exit: jobs never started still go to a process of their own, so the next run is warm."""
        with self.lock:
            if self.queued:
                _start_worker(self.queued)
                self.queued = []

    def wait(self) -> None:
        """Block until every job queued so far has run (benchmarks time compiled kernels only)."""
        while True:
            with self.lock:
                self._advance()
                process = self.running[0] if self.running else None
            if process is None:
                return
            process.wait()

    def _advance(self, start: bool = True) -> None:
        if self.running is not None and self.running[0].poll() is not None:
            process, jobs = self.running
            if process.returncode != 0:
                log.warning("background compile exited with %s; compiling in this process (see %s)",
                            process.returncode, _worker_log())
            self.finished.update(jobs)
            self.running = None
        if start and self.running is None and self.queued:
            if not self.held:
                self._announce()
            jobs, self.queued = self.queued, []
            self.running = (_start_worker(jobs), jobs)

    def _announce(self) -> None:
        if self.unannounced:
            text = notice_text(self.unannounced, again=self.announced_any)
            self.unannounced, self.announced_any = [], True
            warnings.warn(text, CompileNotice, stacklevel=2)


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


def _start_worker(jobs: list[Job]) -> subprocess.Popen:
    cache_dir().mkdir(parents=True, exist_ok=True)
    # It must import this very package: `-m` puts the current folder first on the path, and from a
    # folder holding another mnngpu (a checkout) it would compile that one's kernels instead.
    path = os.pathsep.join(filter(None, [str(PACKAGE.parent), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir()), ENV_SWITCH: "0", "PYTHONPATH": path}
    with open(_worker_log(), "ab") as log_file:
        # its own session: a Ctrl-C at the terminal stops the run, not the compile for the next one
        process = subprocess.Popen([sys.executable, "-m", "mnngpu.jit"], stdin=subprocess.PIPE, cwd=cache_dir(),
                                   stdout=log_file, stderr=log_file, env=env, start_new_session=True)
    process.stdin.write(pickle.dumps(jobs))
    process.stdin.close()
    return process


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
    with BACKGROUND.lock:
        BACKGROUND._advance()
        return bool(BACKGROUND.queued or BACKGROUND.running)


def source_key(*modules) -> str:
    """A digest of these modules' sources: a marker made for other code is not taken as warm."""
    digest = hashlib.sha256()
    for module in modules:
        digest.update(Path(module.__file__).read_bytes())
    return digest.hexdigest()


def _work() -> int:
    jobs: list[Job] = pickle.loads(sys.stdin.buffer.read())
    failed = 0
    with _one_compile_at_a_time():
        for job in jobs:
            try:
                job.run()
            except Exception:  # one failed job leaves the rest to run; the log says why
                log.exception("background compile of %s.%s failed", job.module, job.name)
                failed += 1
        try:
            prune_cache()
        except Exception:  # housekeeping: the kernels are compiled, so the run still takes them
            log.exception("pruning the kernel cache failed")
    return 1 if failed else 0


@contextmanager
def _one_compile_at_a_time():
    """Background processes of one cache folder take turns. A run started while the first run's
    compile still goes on starts its own for the same kernels; waiting, it then finds them in the
    cache and only loads them, where compiling alongside would have slowed both runs."""
    try:
        import fcntl
    except ImportError:   # not POSIX: no lock, the processes compile side by side
        yield
        return
    cache_dir().mkdir(parents=True, exist_ok=True)
    with open(cache_dir() / BACKGROUND_LOCK, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


if __name__ == "__main__":
    logging.basicConfig()
    sys.exit(_work())
