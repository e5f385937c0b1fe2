"""The comparisons the conformance suite makes between mnngpu and MNN's recorded outputs, in one place,
so that the tests that inject a fault (test_injected_faults.py) run exactly the checks the suite runs.

Each check raises AssertionError naming the prompt, the step or row, and the error in units of the
logits' std; tolerance: LOGIT_TOLERANCE x the std of the row (precision high).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mnngpu import llm as mnngpu_llm

LOGIT_TOLERANCE = 1e-3


def load(folder: Path, backend_type: str, **overrides):
    """A model folder loaded as the oracle ran it: precision high, memory high, 2 threads."""
    model = mnngpu_llm.create(folder)
    model.set_config({"backend_type": backend_type, "precision": "high", "memory": "high", "thread_num": 2,
                      **overrides})
    model.load()
    return model


def last_row(model, ids: list[int]) -> np.ndarray:
    return np.asarray(model.forward(ids))[0, -1]


def greedy(model, ids: list[int], steps: int) -> tuple[list[int], np.ndarray]:
    """`steps` greedy tokens after a fresh prefill of ids, and the prefill's last row of logits."""
    model.reset()
    first = last_row(model, ids).copy()
    tokens = [int(np.argmax(first))]
    while len(tokens) < steps:
        tokens.append(int(np.argmax(last_row(model, [tokens[-1]]))))
    return tokens, first


def _within(error: float, scale: float, where: str) -> None:
    if not error <= LOGIT_TOLERANCE * scale:
        raise AssertionError(f"{where}: logits differ from MNN's by {error / scale:.3g} x their std "
                             f"(tolerance {LOGIT_TOLERANCE})")


def check_first_logits(first: np.ndarray, recorded: np.ndarray, where: str) -> None:
    """A whole row of logits against MNN's, at the tolerance of the recorded row's std."""
    _within(float(np.abs(first - recorded).max()), float(recorded.std()), where)


def check_greedy(tokens: list[int], recorded: list[int], where: str) -> None:
    if tokens != recorded:
        step = next(k for k, (a, b) in enumerate(zip(tokens, recorded)) if a != b)
        raise AssertionError(f"{where}: greedy token {step} is {tokens[step]}, MNN's is {recorded[step]}")


def check_top(logits: np.ndarray, top: list, where: str) -> None:
    """One row of logits at the ids MNN recorded as its top ones ([ids, values])."""
    ids, values = top
    _within(float(np.abs(logits[ids] - np.asarray(values, np.float32)).max()), float(logits.std()), where)


def check_greedy_and_first_logits(model, prompt: dict, recorded_first: np.ndarray) -> None:
    """The greedy continuation MNN recorded for the prompt, and its first-step logits."""
    tokens, first = greedy(model, prompt["ids"], len(prompt["greedy"]))
    check_first_logits(first, recorded_first, f"{prompt['text']!r}, first step")
    check_greedy(tokens, prompt["greedy"], repr(prompt["text"]))


def check_every_step(model, prompt: dict) -> None:
    """Every greedy step's top logits (prompt["steps_top"]), each step fed MNN's greedy token."""
    model.reset()
    logits = last_row(model, prompt["ids"])
    for step, top in enumerate(prompt["steps_top"]):
        check_top(logits, top, f"{prompt['text']!r}, step {step}")
        if step + 1 < len(prompt["steps_top"]):
            logits = last_row(model, [prompt["greedy"][step]])


def all_logits_rows(model, ids: list[int]) -> np.ndarray:
    """A fresh all_logits prefill of ids: one row per id (the model loaded with all_logits)."""
    model.reset()
    return np.asarray(model.forward(ids))[0]


def check_every_row(rows: np.ndarray, prompt: dict) -> None:
    """Every row of an all_logits prefill against MNN's recorded rows (prompt["rows_top"])."""
    if not rows.shape[0] == len(prompt["rows_top"]) == len(prompt["ids"]):
        raise AssertionError(f"{rows.shape[0]} rows of all_logits for {len(prompt['ids'])} prompt ids "
                             f"({len(prompt['rows_top'])} recorded)")
    for row, top in enumerate(prompt["rows_top"]):
        check_top(rows[row], top, f"{prompt['text']!r}, all_logits row {row}")
