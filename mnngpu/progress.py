"""The load progress bar and the one-line summary once a model is ready (both on stderr).

    model.load(progress=LoadProgress(sys.stderr))
    print(ready_line(model, seconds), file=sys.stderr)

On a terminal the bar redraws one line in place; anywhere else (a pipe, a log file, a test)
it writes nothing, so the summary is the only line a log receives.
"""

from __future__ import annotations

import sys
from typing import TextIO

from mnngpu.model_label import model_label

BAR_WIDTH = 24


class LoadProgress:
    """A `progress(stage, done, total)` callback for `Llm.load` that draws `stage [####    ] done/total`."""

    def __init__(self, stream: TextIO | None = None):
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = _is_terminal(self.stream)
        self._drawn = 0  # width of the line on screen, to blank it out

    def __call__(self, stage: str, done: int, total: int) -> None:
        if self.enabled:
            self._draw(format_bar(stage, done, total))

    def close(self) -> None:
        """Erase the bar, so the next line starts clean."""
        if self.enabled and self._drawn:
            self._draw("")
            self._drawn = 0

    def _draw(self, line: str) -> None:
        self.stream.write("\r" + line.ljust(self._drawn))
        if not line:
            self.stream.write("\r")
        self.stream.flush()
        self._drawn = len(line)


def format_bar(stage: str, done: int, total: int) -> str:
    total = max(total, 1)
    done = min(max(done, 0), total)
    filled = BAR_WIDTH * done // total
    return f"{stage:<16} [{'#' * filled}{' ' * (BAR_WIDTH - filled)}] {done}/{total}"


def ready_line(model, seconds: float) -> str:
    """`ready: NAME (TYPE, N layers, hidden H, W MB of weights) on BACKEND on DEVICE[, K ops on the CPU
    backup] in S s`."""
    cfg = model.config
    weights_mb = _file_size(cfg.weight_path) / 1e6
    where = model.runtime.describe()
    fallbacks = len(model.runtime.placements.fallbacks)   # placed at load
    if fallbacks:
        where += f", {fallbacks} op{'s' if fallbacks != 1 else ''} fell back to the CPU"
    return (f"ready: {model_label(cfg.base_dir)} ({cfg.model_type}, {cfg.layer_nums} layers, hidden {cfg.hidden_size}, "
            f"{weights_mb:.1f} MB of weights) on {where} in {seconds:.2f} s")


def _file_size(path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _is_terminal(stream: TextIO) -> bool:
    isatty = getattr(stream, "isatty", None)
    try:
        return bool(isatty and isatty())
    except ValueError:  # a closed stream
        return False
