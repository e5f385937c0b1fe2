"""lm-evaluation-harness (`local-completions`) against `mnngpu serve` of the demo model, offline.

Two tasks committed in tests/data/lm_eval: a multiple-choice one, scored by loglikelihood (lm-eval's
echo + logprobs request), and a generate_until one. lm-eval counts tokens with the server's own
tokenizer (its `remote` backend: GET /tokenizer_info, POST /tokenize), so nothing comes from the hub.

Truths: each choice's loglikelihood is the sum, over the continuation's tokens, of a numpy float64
log-softmax of the logits mnngpu's own forward gives for the same ids (all_logits, a second model
instance); each generated text is the argmax continuation of those logits, and the server's greedy
reply to the same prompt, cut at the task's stop string.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import yaml

lm_eval = pytest.importorskip("lm_eval")
httpx = pytest.importorskip("httpx")

from mnngpu import llm
from mnngpu.demo import demo_model_dir
from tests.reference_model import ORACLE_CONFIG
from tests.serving import ServeProcess

TASKS_DIR = Path(__file__).resolve().parent / "data" / "lm_eval"
CHOICE_TASK, GENERATE_TASK = "mnngpu_story_choice", "mnngpu_story_continue"
TOLERANCE = 1e-4


def task_config(name: str, cache_dir: Path) -> dict:
    """A committed task file, with its data files found next to it and the datasets cache in cache_dir."""
    config = yaml.safe_load((TASKS_DIR / f"{name}.yaml").read_text())
    files = config["dataset_kwargs"]["data_files"]
    config["dataset_kwargs"] = {"data_files": {split: str(TASKS_DIR / path) for split, path in files.items()},
                                "cache_dir": str(cache_dir)}
    return config


@pytest.fixture(scope="module")
def server():
    process = ServeProcess("--quiet", model_dir=demo_model_dir())
    try:
        yield f"http://127.0.0.1:{process.port}"
    finally:
        process.kill()


@pytest.fixture(scope="module")
def evaluation(server, tmp_path_factory):
    import datasets
    from lm_eval.tasks import TaskManager

    with pytest.MonkeyPatch.context() as patch:
        # no hub: the environment for anything lm-eval starts, datasets' flags as it read them on import
        patch.setenv("HF_DATASETS_OFFLINE", "1")
        patch.setenv("HF_HUB_OFFLINE", "1")
        patch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
        patch.setattr(datasets.config, "HF_DATASETS_OFFLINE", True)
        cache = tmp_path_factory.mktemp("datasets")
        return lm_eval.simple_evaluate(
            model="local-completions",
            model_args={"base_url": f"{server}/v1/completions", "model": "demo", "tokenizer_backend": "remote",
                        "max_retries": 1},
            tasks=[task_config(CHOICE_TASK, cache), task_config(GENERATE_TASK, cache)],
            task_manager=TaskManager(include_defaults=False),
            log_samples=True)


@pytest.fixture(scope="module")
def truth_model():
    model = llm.create(demo_model_dir() / "config.json")
    model.set_config({**ORACLE_CONFIG, "sampler_type": "greedy", "all_logits": True})
    model.load()
    return model


def log_softmax(rows) -> np.ndarray:
    x = np.asarray(rows, dtype=np.float64)
    top = x.max(axis=-1, keepdims=True)
    return x - top - np.log(np.exp(x - top).sum(axis=-1, keepdims=True))


def truth_loglikelihood(model, context: str, continuation: str) -> tuple[float, bool]:
    """The continuation's log-probability after the context, and whether each of its tokens is the argmax."""
    context_ids, ids = model.tokenizer_encode(context), model.tokenizer_encode(context + continuation)
    assert ids[:len(context_ids)] == context_ids and len(ids) > len(context_ids), "pick a cleanly split item"
    model.reset()
    rows = log_softmax(np.asarray(model.forward(ids))[0])
    positions = range(len(context_ids), len(ids))
    return (float(sum(rows[i - 1][ids[i]] for i in positions)),
            all(int(np.argmax(rows[i - 1])) == ids[i] for i in positions))


def truth_greedy_text(model, prompt: str, max_tokens: int, stop: str) -> str:
    ids = model.tokenizer_encode(prompt)
    generated: list[int] = []
    for _ in range(max_tokens):
        model.reset()
        token = int(np.argmax(np.asarray(model.forward(ids + generated))[0, -1]))
        if model.tokenizer.is_stop(token):
            break
        generated.append(token)
    text = b"".join(model.tokenizer.token_bytes(t) for t in generated).decode(errors="replace")
    return text.split(stop)[0]


def test_lm_eval_loglikelihoods_are_the_models_log_softmax_sums(evaluation, truth_model):
    samples = evaluation["samples"][CHOICE_TASK]
    assert len(samples) == len((TASKS_DIR / "story_choice.jsonl").read_text().splitlines())
    for sample in samples:
        for (context, continuation), (loglikelihood, is_greedy) in zip(sample["arguments"],
                                                                       sample["filtered_resps"], strict=True):
            expected, expected_greedy = truth_loglikelihood(truth_model, context, continuation)
            assert loglikelihood == pytest.approx(expected, abs=TOLERANCE), (context, continuation)
            assert is_greedy == expected_greedy, (context, continuation)
    assert evaluation["results"][CHOICE_TASK]["acc,none"] == np.mean(
        [int(np.argmax([r[0] for r in s["filtered_resps"]]) == s["target"]) for s in samples])


def test_lm_eval_generations_are_the_servers_greedy_replies(evaluation, server, truth_model):
    config = yaml.safe_load((TASKS_DIR / f"{GENERATE_TASK}.yaml").read_text())["generation_kwargs"]
    samples = evaluation["samples"][GENERATE_TASK]
    assert samples
    for sample in samples:
        prompt = sample["arguments"][0][0]
        generated = sample["filtered_resps"][0]
        reply = httpx.post(f"{server}/v1/completions", timeout=60, json={
            "prompt": prompt, "max_tokens": config["max_gen_toks"], "temperature": 0, "stop": config["until"]})
        assert reply.status_code == 200, reply.text
        assert generated == reply.json()["choices"][0]["text"], prompt
        assert generated == truth_greedy_text(truth_model, prompt, config["max_gen_toks"], config["until"][0])
        assert generated.strip(), f"an empty generation checks nothing: pick another prompt than {prompt!r}"
