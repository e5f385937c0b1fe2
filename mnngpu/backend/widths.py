"""The rows of the modules in an Llm's pool, as a backend sizes for them: a prefill chunk's rows
(PREFILL_LEN, the KV cache's padding), the widths of a fixed-shape backend's prefill modules, and
the rows a recurrent layer keeps room to save (runtime/module_pool.py picks among the modules)."""

from __future__ import annotations

import os

from mnngpu.errors import ConfigError

PREFILL_LEN = 100   # rows of a prefill chunk; schedule.py hands it to the backends (prefill_len)
SMALL_PREFILL_LEN = 32   # rows of the short prefill module of a fixed-shape backend
WIDTHS_ENV = "MNNGPU_PREFILL_WIDTHS"   # e.g. "16,100"; "100" pads every chunk to PREFILL_LEN rows


def prefill_widths() -> tuple[int, ...]:
    """The rows of a fixed-shape backend's prefill modules, smallest first, PREFILL_LEN the largest
    (the KV cache is padded for it): SMALL_PREFILL_LEN and PREFILL_LEN unless WIDTHS_ENV lists others."""
    wanted = os.environ.get(WIDTHS_ENV)
    if wanted is None:
        return (SMALL_PREFILL_LEN, PREFILL_LEN)
    try:
        widths = {int(part) for part in wanted.split(",")}
    except ValueError:
        widths = set()
    if not widths or not all(2 <= width <= PREFILL_LEN for width in widths):
        raise ConfigError(f"{wanted!r}: expected comma-separated row counts from 2 to {PREFILL_LEN}",
                          field=WIDTHS_ENV)
    return tuple(sorted(widths | {PREFILL_LEN}))


def saved_rows_room(seq: int, widths: tuple[int, ...]) -> int:
    """The rows a recurrent layer keeps room to save in a fixed-shape module of `seq` rows that may
    run a verify block (ops.linear_attention.saves_verify_rows): at least the largest short prefill
    width, since such a module cannot be told from the verify module by its rows. The recorded
    kernels bind the saved-row buffers, so all of them then bind the same ones, whichever resizes first."""
    return max([seq, *(width for width in widths if width < PREFILL_LEN)])
