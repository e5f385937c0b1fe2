"""Damaged copies of the fixture model folders, and the checks every damaged folder must pass.

    folder = model_copy(tmp_path, "qwen2_int4_b64")      # the model files, without hf/ and references
    with untouched(folder):                               # read-only while inside; same bytes after
        stage, error = first_failure(folder)              # ("load", WeightFileError(...)) or ("done", None)

`untouched` proves that nothing writes into the folder twice over: the files are chmod'ed
read-only (which binds everyone but root), and an audit hook records every open for writing,
removal, rename or mkdir under the folder (which binds root too); afterwards every file must
hash as before and no file may have appeared or gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import struct
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path

from mnngpu import llm
from mnngpu.errors import MnnGpuError

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "tests" / "fixtures" / "models"
TOKENIZERS = REPO / "tests" / "fixtures" / "tokenizers"
MODEL_NAMES = sorted(p.name for p in MODELS.iterdir() if (p / "llm.mnn").is_file())
NOT_MODEL_FILES = ("hf", "reference.json", "*.npy")


def model_copy(tmp_path: Path, name: str) -> Path:
    folder = tmp_path / name
    shutil.copytree(MODELS / name, folder, ignore=shutil.ignore_patterns(*NOT_MODEL_FILES))
    return folder


# ---- nothing writes into the folder ------------------------------------------------------

_watched: list[Path] = []
_writes: list[str] = []
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC
_PATH_EVENTS = {"os.remove", "os.rename", "os.mkdir", "os.rmdir", "os.truncate", "os.symlink", "os.link",
                "shutil.rmtree", "shutil.copyfile", "shutil.move"}


def _is_watched(path) -> bool:
    try:
        resolved = Path(os.fsdecode(path)).resolve()
    except (TypeError, ValueError, OSError):
        return False
    return any(resolved == root or root in resolved.parents for root in _watched)


def _audit(event: str, args: tuple) -> None:
    if not _watched:
        return
    if event == "open":
        path, mode, flags = args
        writes = (mode is not None and any(c in mode for c in "wax+")) or (mode is None and flags & _WRITE_FLAGS)
        if writes and isinstance(path, str | bytes | os.PathLike) and _is_watched(path):
            _writes.append(f"open {path} {mode or flags}")
    elif event in _PATH_EVENTS and args and _is_watched(args[0]):
        _writes.append(f"{event} {args[0]}")


sys.addaudithook(_audit)


def snapshot(folder: Path) -> dict[str, str]:
    """sha256 of every file under folder, by relative path (folders listed with "dir")."""
    found = {}
    for path in sorted(folder.rglob("*")):
        key = str(path.relative_to(folder))
        found[key] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return found


@contextlib.contextmanager
def untouched(folder: Path) -> Iterator[None]:
    """Inside, the folder is read-only and watched; on leaving, it must be byte for byte as before."""
    before = snapshot(folder)
    paths = [folder, *folder.rglob("*")]
    modes = {path: path.stat().st_mode for path in paths}
    for path in paths:
        path.chmod(modes[path] & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    _watched.append(folder.resolve())
    _writes.clear()
    try:
        yield
    finally:
        _watched.remove(folder.resolve())
        for path in paths:
            path.chmod(modes[path])
    assert not _writes, f"writes into the model folder: {_writes}"
    assert snapshot(folder) == before, "the model folder changed"


# ---- the whole flow ----------------------------------------------------------------------

STAGES = ("create", "load", "forward", "encode", "response", "done")
TEXT = "hello world, the quick brown fox"


def first_failure(folder: Path, ids=(1, 2, 3), overrides: dict | None = None) -> tuple[str, MnnGpuError | None]:
    """Run create, load, forward(ids), tokenizer_encode(TEXT), response(TEXT); the stage that raised and
    its error.

    Only an MnnGpuError is caught: anything else propagates and fails the test that called this."""
    stage = "create"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            model = llm.create(folder)
            model.set_config({"thread_num": 1, **(overrides or {})})
            stage = "load"
            model.load()
        stage = "forward"
        model.forward(list(ids))
        stage = "encode"
        model.tokenizer_encode(TEXT)
        stage = "response"
        model.response(TEXT, max_new_tokens=2)
    except MnnGpuError as error:
        return stage, error
    return "done", None


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    return subprocess.run([sys.executable, "-m", "mnngpu", *args], capture_output=True, text=True, env=env, check=False,
                          timeout=300)


def assert_one_error_line(result: subprocess.CompletedProcess, exit_code: int = 2) -> str:
    """The CLI failed with `exit_code` and exactly one `error: ...` line, no traceback; returns it."""
    lines = result.stderr.splitlines()
    errors = [line for line in lines if line.startswith("error: ")]
    assert result.returncode == exit_code, (result.returncode, result.stderr)
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    return errors[0]


# ---- locating fields in an .mnn file, independently of mnngpu's reader ----------------------

def _u32(data: bytes, pos: int) -> int:
    return struct.unpack_from("<I", data, pos)[0]


def field_position(data: bytes, table: int, index: int) -> int | None:
    """Where field `index` of the table at `table` is stored, or None when it is absent."""
    vtable = table - struct.unpack_from("<i", data, table)[0]
    vtable_size = struct.unpack_from("<H", data, vtable)[0]
    slot = 4 + 2 * index
    if slot >= vtable_size:
        return None
    offset = struct.unpack_from("<H", data, vtable + slot)[0]
    return table + offset if offset else None


def vector_at(data: bytes, field: int) -> tuple[int, int]:
    """(position of the first element, length) of the vector a field points to."""
    start = field + _u32(data, field)
    return start + 4, _u32(data, start)


def _root_tables(data: bytes, field: int) -> list[int]:
    first, count = vector_at(data, field_position(data, _u32(data, 0), field))
    return [first + 4 * i + _u32(data, first + 4 * i) for i in range(count)]


def op_tables(data: bytes) -> list[int]:
    """Positions of the Net's op tables (Net field 3 is oplists), in graph order."""
    return _root_tables(data, 3)


def subgraph_tables(data: bytes) -> list[int]:
    """Positions of the Net's SubGraphProto tables (Net field 10 is subgraphs)."""
    return _root_tables(data, 10)


OP_INPUTS, OP_MAIN_TYPE, OP_OUTPUTS, OP_TYPE = 0, 1, 4, 5  # Op field indices in MNN.fbs
CONVOLUTION = 12  # OpType.Convolution


def first_op_of_type(data: bytes, op_type: int) -> int:
    for table in op_tables(data):
        pos = field_position(data, table, OP_TYPE)
        if pos is not None and struct.unpack_from("<i", data, pos)[0] == op_type:
            return table
    raise LookupError(f"no op of type {op_type}")
