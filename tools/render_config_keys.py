"""Rewrite the config-key table in docs/formats.md from mnngpu.config.keys (run after editing the table)."""

from __future__ import annotations

from pathlib import Path

from mnngpu.config.keys import markdown_table

DOC = Path(__file__).resolve().parents[1] / "docs" / "formats.md"
START, END = "<!-- config-keys:start -->\n", "<!-- config-keys:end -->\n"


def main() -> None:
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(START, 1)
    _, tail = rest.split(END, 1)
    DOC.write_text(head + START + markdown_table() + END + tail, encoding="utf-8")


if __name__ == "__main__":
    main()
