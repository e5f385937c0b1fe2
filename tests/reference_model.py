"""The qwen2 fixture as the front-door tests (run, chat, serve) use it, with its independent truths.

The model is loaded with the settings MNN's recorded run used, so greedy replies can be checked
against reference.json. Token counts and chat templates are checked with the HuggingFace
source (hf/tokenizer.json, hf/chat_template.jinja) rendered the way transformers renders it.
"""

from __future__ import annotations

import json
from functools import cache

import jinja2
from tokenizers import Tokenizer

from tests.conftest import FIXTURES

MODEL = "qwen2_int4_b64"
MODEL_DIR = FIXTURES / MODEL
ORACLE_CONFIG = {"precision": "high", "memory": "high", "thread_num": 2}
CLI_ORACLE_FLAGS = ["--precision", "high", "--config", "memory=high", "-t", "2"]


def load_model(**overrides):
    from mnngpu import llm

    model = llm.create(MODEL_DIR / "config.json")
    model.set_config({**ORACLE_CONFIG, "sampler_type": "greedy", **overrides})
    model.load()
    return model


@cache
def hf_tokenizer() -> Tokenizer:
    return Tokenizer.from_file(str(MODEL_DIR / "hf" / "tokenizer.json"))


def hf_count(text: str) -> int:
    return len(hf_tokenizer().encode(text).ids)


def hf_render(messages: list[dict], add_generation_prompt: bool = True) -> str:
    """The HF chat template, with the jinja2 settings transformers uses."""
    source = (MODEL_DIR / "hf" / "chat_template.jinja").read_text()
    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True)
    return env.from_string(source).render(messages=messages, add_generation_prompt=add_generation_prompt)


@cache
def stop_ids() -> frozenset[int]:
    from mnngpu.tokenizer import load_tokenizer

    config = json.loads((MODEL_DIR / "config.json").read_text())
    return frozenset(load_tokenizer(MODEL_DIR, config["tokenizer_file"]).stop_ids)


def recorded(text: str) -> dict:
    """MNN's recorded run for one prompt text: its ids and 16 greedy tokens."""
    prompts = json.loads((MODEL_DIR / "reference.json").read_text())["prompts"]
    return next(p for p in prompts if p["text"] == text)


def greedy_reply(text: str, max_tokens: int) -> tuple[list[int], str]:
    """MNN's greedy ids after `text` up to max_tokens or the first stop id, and their text."""
    ids = []
    for token in recorded(text)["greedy"][:max_tokens]:
        if token in stop_ids():
            break
        ids.append(token)
    return ids, hf_tokenizer().decode(ids, skip_special_tokens=False)


RAW_PROMPT = "hello"
CHAT_QUESTION = "Where does the farmer walk?"
CHAT_PROMPT = hf_render([{"role": "user", "content": CHAT_QUESTION}])
