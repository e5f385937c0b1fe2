"""Add every greedy step's top logits ("steps_top", each prompt) and one prompt's all_logits rows
("rows_top") to the fixtures that MNN 3.6.1's wheel recorded, leaving the rest of reference.json as is.

The wheel (tests/mnn_oracle.py, in a subprocess) re-records each fixture as it was recorded first: its
settings, 16 greedy steps, one process for all prompts or one per prompt (fresh_instance_per_prompt).
A fixture is changed only where the new run's prompt ids, greedy tokens and first-step logits are
bit for bit the committed ones; otherwise it is left alone and reported.

    python -m tools.record_steps_top            # every wheel-recorded fixture
    python -m tools.record_steps_top qwen3_fp16 # only the named ones
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from tools.make_fixtures import ALL_ROWS_PROMPT, FIXTURES, to_readable_json
from tools.mnn_export import ORACLE, folder_size

TOP = 8


def oracle(model_dir: Path, texts: list[str], settings: dict, out: Path, *extra: str) -> dict:
    subprocess.run([sys.executable, str(ORACLE), str(model_dir), "--prompts-json", json.dumps(texts),
                    "--config-json", json.dumps(settings), "--json-out", str(out), *extra],
                   check=True, capture_output=True, timeout=600)
    return json.loads(out.read_text())


def record_steps(folder: Path, ref: dict, tmp: Path) -> tuple[list[dict], np.ndarray]:
    """Each prompt's greedy run with its steps' top logits, batched as the fixture was recorded."""
    texts = [p["text"] for p in ref["prompts"]]
    batches = [[text] for text in texts] if ref.get("fresh_instance_per_prompt") else [texts]
    prompts, logits = [], []
    for k, batch in enumerate(batches):
        npy = tmp / f"first{k}.npy"
        prompts += oracle(folder, batch, ref["settings"], tmp / f"steps{k}.json", "--steps",
                          str(len(ref["prompts"][0]["greedy"])), "--steps-top", str(TOP),
                          "--logits-out", str(npy))["prompts"]
        logits.append(np.load(npy))
    return prompts, np.concatenate(logits)


def record_rows(folder: Path, ref: dict, tmp: Path) -> list:
    """ALL_ROWS_PROMPT's all_logits rows, from a copy of the model files (the oracle writes a config
    beside them for the run)."""
    copy = tmp / "model"
    shutil.copytree(folder, copy, ignore=shutil.ignore_patterns("hf"))
    text = ref["prompts"][ALL_ROWS_PROMPT]["text"]
    record = oracle(copy, [text], ref["settings"], tmp / "rows.json", "--rows-top", str(TOP))["prompts"][0]
    if record["ids"] != ref["prompts"][ALL_ROWS_PROMPT]["ids"]:
        raise ValueError("the all_logits run tokenized the prompt differently")
    return record["rows_top"]


def mismatch(ref: dict, first_logits: np.ndarray, live: list[dict], live_logits: np.ndarray) -> str | None:
    """Why the new run is not the committed recording, or None where it is, bit for bit."""
    for recorded, now in zip(ref["prompts"], live, strict=True):
        if now["ids"] != recorded["ids"] or now["greedy"] != recorded["greedy"]:
            return f"{recorded['text']!r}: ids or greedy tokens differ"
    if not np.array_equal(live_logits, first_logits):
        return f"first-step logits differ by up to {np.abs(live_logits - first_logits).max():.3g}"
    return None


def add_records(folder: Path) -> str:
    text = (folder / "reference.json").read_text()
    ref = json.loads(text)
    if to_readable_json(ref) != text:
        return "left alone: reference.json is not in make_fixtures' layout, so it would be rewritten"
    before = folder_size(folder)
    with tempfile.TemporaryDirectory() as tmp:
        live, live_logits = record_steps(folder, ref, Path(tmp))
        why = mismatch(ref, np.load(folder / "first_logits.npy"), live, live_logits)
        if why:
            return f"left alone: {why}"
        rows = record_rows(folder, ref, Path(tmp))
    for prompt, now in zip(ref["prompts"], live):
        prompt["steps_top"] = now["steps_top"]
    ref["prompts"][ALL_ROWS_PROMPT]["rows_top"] = rows
    (folder / "reference.json").write_text(to_readable_json(ref))
    return f"added: {before / 1e6:.3f} MB -> {folder_size(folder) / 1e6:.3f} MB"


def wheel_recorded() -> list[str]:
    return sorted(p.parent.name for p in FIXTURES.glob("*/reference.json")
                  if "recorded_by" not in json.loads(p.read_text()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("names", nargs="*", help="fixture names (default: every wheel-recorded fixture)")
    names = parser.parse_args().names or wheel_recorded()
    for name in names:
        print(f"{name}: {add_records(FIXTURES / name)}", flush=True)


if __name__ == "__main__":
    main()
