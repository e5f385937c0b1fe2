"""A model folder for the thinking tests whose tokenizer has the think markers as one special
token each: the qwen2 fixture's weights, and its HF tokenizer written as an MNN tokenizer.txt
(type 3, byte-level BPE) with `<think>` in place of `<|endoftext|>` (id 0) and `</think>` in
place of its last merged token (id 479), both special. Ids stay within the embedding's rows, and
ChatML's own markers keep their ids."""

from __future__ import annotations

import json
from pathlib import Path

from tests.reference_model import MODEL_DIR

START_ID, END_ID = 0, 479


def make_thinking_model(folder: Path, chat_template: str) -> Path:
    """`folder` holding the model, with `chat_template` as its jinja.chat_template."""
    folder.mkdir(parents=True, exist_ok=True)
    for name in ("llm.mnn", "llm.mnn.weight", "embeddings_bf16.bin"):
        (folder / name).symlink_to(MODEL_DIR / name)
    config = json.loads((MODEL_DIR / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "tokenizer_file": "tokenizer.txt"}))
    llm_config = json.loads((MODEL_DIR / "llm_config.json").read_text())
    llm_config["jinja"] = {"chat_template": chat_template, "eos": "<|im_end|>"}
    (folder / "llm_config.json").write_text(json.dumps(llm_config))
    (folder / "tokenizer.txt").write_text(_tokenizer_txt(), encoding="utf-8")
    return folder


def _tokenizer_txt() -> str:
    source = json.loads((MODEL_DIR / "hf" / "tokenizer.json").read_text())
    vocab = {token_id: token for token, token_id in source["model"]["vocab"].items()}
    vocab[START_ID], vocab[END_ID] = "<think>", "</think>"
    tokens = [vocab[i] for i in range(len(vocab))]
    merges = [" ".join(m) if isinstance(m, list) else m for m in source["model"]["merges"]]
    specials = [START_ID, 1, 2, END_ID]
    stops = [2]   # <|im_end|>
    lines = ["430 3", f"{len(specials)} {len(stops)} 0", " ".join(map(str, specials + stops)),
             f"{len(tokens)} {len(merges)}", *tokens, *merges]
    return "\n".join(lines) + "\n"
