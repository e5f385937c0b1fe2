"""MNN at tools/build_mnn.py's MNN_COMMIT, the newer export format (C4 fusion and fp16 quantization
scales by default): export with that commit's own llmexport.py and MNNConvert, and record what that
commit's runtime does on an export (tools/mnn_recorder.cpp). make_fixtures.py's "head" specs use it.

The build is named by the environment, never by a path in the code:

    python -m tools.build_mnn MNN_GIT_DIR WORKDIR
    export MNN_HEAD_BUILD=WORKDIR/build-<commit9>   # the source is found beside it, WORKDIR/src-<commit9>
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from tools.build_mnn import DONE_MARK, MNN_COMMIT
from tools.mnn_export import export_mnn

HEAD_BUILD_ENV = "MNN_HEAD_BUILD"
SHORT_COMMIT = MNN_COMMIT[:9]
RECORDED_BY = f"MNN {SHORT_COMMIT} (tools/mnn_recorder.cpp)"
EXPORTED_BY = f"MNN {SHORT_COMMIT} (transformers/llm/export/llmexport.py)"
EXPORT_SCRIPT_DIR = Path("transformers") / "llm" / "export"


@dataclass(frozen=True)
class HeadBuild:
    build: Path    # WORKDIR/build-<commit9>: MNNConvert, libMNN.so, mnn_recorder
    source: Path   # WORKDIR/src-<commit9>

    @property
    def converter(self) -> Path:
        return self.build / "MNNConvert"

    @property
    def recorder(self) -> Path:
        return self.build / "mnn_recorder"

    @property
    def export_dir(self) -> Path:
        return self.source / EXPORT_SCRIPT_DIR


def head_build() -> HeadBuild:
    """The MNN build $MNN_HEAD_BUILD names and the source beside it; exits with what to do if either
    is missing or is of another commit."""
    hint = (f"build MNN {SHORT_COMMIT} with `python -m tools.build_mnn MNN_GIT_DIR WORKDIR` and set "
            f"{HEAD_BUILD_ENV}=WORKDIR/build-{SHORT_COMMIT}")
    value = os.environ.get(HEAD_BUILD_ENV)
    if not value:
        raise SystemExit(f"error: {HEAD_BUILD_ENV} is not set: {hint}")
    build = Path(value).expanduser().resolve()
    head = HeadBuild(build, build.parent / f"src-{SHORT_COMMIT}")
    missing = [str(path) for path in (head.converter, head.recorder, head.export_dir / "llmexport.py",
                                      head.source / DONE_MARK) if not path.is_file()]
    if missing:
        raise SystemExit(f"error: {HEAD_BUILD_ENV}={value}: missing {', '.join(missing)}; {hint}")
    commit = (head.source / DONE_MARK).read_text().strip()
    if commit != MNN_COMMIT:
        raise SystemExit(f"error: {head.source} holds MNN {commit}, not {MNN_COMMIT}; {hint}")
    return head


def export_head(hf_dir: Path, out_dir: Path, *extra_args: str) -> Path:
    """Export hf_dir to out_dir with the newer llmexport.py and its MNNConvert; returns out_dir."""
    head = head_build()
    return export_mnn(hf_dir, out_dir, *extra_args, "--mnnconvert", str(head.converter),
                      script_dir=head.export_dir)


def converter_argv() -> list[str]:
    """The newer MNNConvert, the converter that knows the newer ops (FusedLinear, RoPE, GatedRMSNorm)."""
    return [str(head_build().converter)]


def _recorder_lines(config: Path, ids: list[int], settings: dict, steps: int, top_k: int) -> list[dict]:
    argv = [str(head_build().recorder), str(config), json.dumps(settings), str(steps), str(top_k),
            *map(str, ids)]
    done = subprocess.run(argv, check=False, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"mnn_recorder failed on {config} (exit {done.returncode}):\n"
                           f"{done.stdout[-2000:]}{done.stderr[-4000:]}")
    # MNN prints its CPU feature line on stdout too
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def record_prefill_rows(config: Path, ids: list[int], settings: dict, keep_top: int = 8) -> list[list]:
    """[ids, logits] of the `keep_top` largest logits of every row of the prefill of `ids` (all_logits),
    in a fresh mnn_recorder process."""
    rows = [line for line in _recorder_lines(config, ids, {**settings, "all_logits": True}, 0, keep_top)
            if "prefill_row" in line]
    if [row["prefill_row"] for row in rows] != list(range(len(ids))):
        raise RuntimeError(f"mnn_recorder on {config} printed {len(rows)} prefill rows for {len(ids)} ids")
    return [[row["top_ids"], row["top_logits"]] for row in rows]


def run_recorder(config: Path, ids: list[int], settings: dict, steps: int, top_k: int) -> list[dict]:
    """One fresh mnn_recorder process on `ids`: a record per forward, the prefill (step 0) and `steps`
    greedy steps after it, each with the top_k ids and logits."""
    forwards = _recorder_lines(config, ids, settings, steps, top_k)
    if [f["step"] for f in forwards] != list(range(steps + 1)):
        raise RuntimeError(f"mnn_recorder on {config} printed steps {[f['step'] for f in forwards]}, "
                           f"not 0..{steps}")
    return forwards


def record_head(model_dir: Path, prompts: list[tuple[str, list[int]]], settings: dict, vocab: int,
                greedy_tokens: int = 16, keep_top: int = 8) -> tuple[list[dict], np.ndarray]:
    """What the newer runtime does on model_dir, one fresh instance per prompt: for each (text, ids),
    {"text", "ids", "greedy", "steps_top"} where steps_top[k] is [ids, logits] of the `keep_top`
    largest logits of the forward that picked greedy[k] (k = 0: the prefill); and the prefill's
    full last-row logits, [n_prompts, vocab] float32 in id order."""
    records, first_logits = [], []
    for text, ids in prompts:
        # the recorder's STEPS counts the forwards after the prefill: greedy_tokens - 1 of them
        forwards = run_recorder(Path(model_dir) / "config.json", ids, settings, greedy_tokens - 1, vocab)
        prefill = forwards[0]
        if sorted(prefill["top_ids"]) != list(range(vocab)):
            raise RuntimeError(f"{model_dir}: the prefill's logits do not cover the {vocab}-token vocabulary")
        row = np.zeros(vocab, np.float32)
        row[prefill["top_ids"]] = prefill["top_logits"]
        first_logits.append(row)
        steps_top = [[f["top_ids"][:keep_top], f["top_logits"][:keep_top]] for f in forwards]
        records.append({"text": text, "ids": ids, "greedy": [f["argmax"] for f in forwards],
                        "steps_top": steps_top})
    return records, np.stack(first_logits)
