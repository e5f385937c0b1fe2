"""The bundled demo model has learned its corpus: on held-out generated text its perplexity is at
most half that of a unigram model fitted on training-corpus tokens (add-one smoothing).

The held-out text and the unigram's training text come from tools/demo_corpus.py (different
seeds), tokenized by the engine under test from the shipped tokenizer file. Each document is
scored after an <|endoftext|>, as the model saw documents in training.

Two engines: mnngpu's own (once `mnngpu.llm` exists) and MNN's runtime, in a subprocess that
runs this file as a script (MNN.llm can segfault).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest

from mnngpu.demo import demo_model_dir
from tests.test_first_run import DEMO_REPLY
from tools import demo_corpus

HELDOUT_DOCUMENTS = 24
# A prefix of the training corpus's plain documents: enough tokens (~80k) for the unigram
# estimate to settle, and fast to tokenize.
UNIGRAM_DOCUMENTS = 1000
MAX_PERPLEXITY_RATIO = 0.5
MAX_MODEL_BYTES = 8_000_000
GREEDY_PROMPT = "Once upon a time,"
README_PROMPT = "What colour is a crow?"   # the README's first command
GREEDY_STEPS = 40
RUN_SETTINGS = {"all_logits": True, "precision": "high", "memory": "high", "thread_num": 2}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits.astype(np.float64) - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def as_rows(output) -> np.ndarray:
    """Logits as float32 [seq, vocab], from a numpy array or an MNN Var."""
    values = np.asarray(output.read() if hasattr(output, "read") else output, dtype=np.float32)
    return values.reshape(-1, values.shape[-1])


def score_documents(llm, docs: list[str]) -> tuple[list[list[int]], np.ndarray, int]:
    """Each document's ids, the model's log-prob of every one of them, and the vocab size."""
    eot = [int(i) for i in llm.tokenizer_encode("<|endoftext|>")]
    assert len(eot) == 1, f"<|endoftext|> should be one special token, got {eot}"
    doc_ids, target_logprobs, vocab = [], [], 0
    for doc in docs:
        ids = [int(i) for i in llm.tokenizer_encode(doc)]
        llm.reset()
        rows = as_rows(llm.forward(eot + ids))
        assert rows.shape[0] == len(ids) + 1, "forward must return logits for every position (all_logits)"
        vocab = rows.shape[1]
        target_logprobs.append(log_softmax(rows[:-1])[np.arange(len(ids)), ids])
        doc_ids.append(ids)
    return doc_ids, np.concatenate(target_logprobs), vocab


def greedy_ids(llm, prompt: str, steps: int) -> list[int]:
    llm.reset()
    out = [int(np.argmax(as_rows(llm.forward([int(i) for i in llm.tokenizer_encode(prompt)]))[-1]))]
    while len(out) < steps:
        out.append(int(np.argmax(as_rows(llm.forward([out[-1]]))[-1])))
    return out


def measure(llm) -> dict:
    heldout_ids, logprobs, vocab = score_documents(
        llm, demo_corpus.documents(HELDOUT_DOCUMENTS, demo_corpus.HELDOUT_SEED))
    train_ids = [int(i) for doc in demo_corpus.documents(UNIGRAM_DOCUMENTS, demo_corpus.TRAIN_SEED)
                 for i in llm.tokenizer_encode(doc)]
    return {
        "model_perplexity": math.exp(-float(logprobs.mean())),
        "unigram_perplexity": demo_corpus.unigram_perplexity(train_ids, heldout_ids, vocab),
        "scored_tokens": int(logprobs.size),
    }


def assert_beats_unigram(result: dict) -> None:
    ratio = result["model_perplexity"] / result["unigram_perplexity"]
    assert result["scored_tokens"] > 1000
    assert ratio <= MAX_PERPLEXITY_RATIO, (
        f"demo model perplexity {result['model_perplexity']:.2f} vs unigram "
        f"{result['unigram_perplexity']:.2f} (ratio {ratio:.3f} > {MAX_PERPLEXITY_RATIO})")


def corpus_words() -> set[str]:
    docs = demo_corpus.documents(2000, demo_corpus.TRAIN_SEED)
    return set(re.findall(r"[A-Za-z']+", " ".join(docs)))


def test_demo_model_folder_holds_the_files_its_config_names() -> None:
    folder = demo_model_dir()
    config = json.loads((folder / "config.json").read_text())
    for key in ("llm_model", "llm_weight", "tokenizer_file"):
        assert (folder / config[key]).is_file(), f"{key} names {config[key]}, which is not shipped"
    assert (folder / "llm_config.json").is_file()
    assert sum(p.stat().st_size for p in folder.iterdir()) <= MAX_MODEL_BYTES


def test_mnngpu_engine_beats_unigram_baseline() -> None:
    llm_module = pytest.importorskip("mnngpu.llm")
    llm = llm_module.create(str(demo_model_dir()))
    llm.set_config(json.dumps({"all_logits": True, "precision": "high"}))
    llm.load()
    assert_beats_unigram(measure(llm))


@pytest.fixture(scope="module")
def mnn_result() -> dict:
    pytest.importorskip("MNN")
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        done = subprocess.run([sys.executable, "-m", "tests.test_demo_model", str(demo_model_dir()), str(out)],
                              check=False, capture_output=True, text=True, timeout=300,
                              cwd=Path(__file__).resolve().parents[1])
        assert done.returncode == 0, done.stderr[-3000:]
        return json.loads(out.read_text())


def test_mnn_runtime_beats_unigram_baseline(mnn_result: dict) -> None:
    assert_beats_unigram(mnn_result)


def test_the_readme_commands_reply_is_mnns(mnn_result: dict) -> None:
    """DEMO_REPLY, which the first-run tests expect from `mnngpu run -p "What colour is a crow?"`, is what
    MNN's own runtime answers on the shipped folder."""
    assert mnn_result["readme_reply"].strip() == DEMO_REPLY


def test_mnn_greedy_output_is_corpus_english(mnn_result: dict) -> None:
    words = re.findall(r"[A-Za-z']+", mnn_result["greedy_text"])
    assert len(words) >= 10, mnn_result["greedy_text"]
    known = corpus_words()
    unknown = [w for w in words if w not in known]
    assert len(unknown) <= len(words) // 10, f"not corpus words: {unknown} in {mnn_result['greedy_text']!r}"


def run_mnn(model_dir: Path, out: Path) -> None:
    """MNN 3.6.1 honours all_logits only from the config file, so run a copy with it set there."""
    import MNN.llm as mnn_llm

    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "model"
        shutil.copytree(model_dir, copy)
        config = json.loads((copy / "config.json").read_text())
        (copy / "config.json").write_text(json.dumps({**config, **RUN_SETTINGS}))
        llm = mnn_llm.create(str(copy / "config.json"))
        llm.load()
        result = measure(llm)
        ids = greedy_ids(llm, GREEDY_PROMPT, GREEDY_STEPS)
        result["greedy_text"] = "".join(llm.tokenizer_decode(i) for i in ids)
    # The README's first command through MNN: a fresh instance on the folder as shipped, its chat
    # template and sampler as its config sets them.
    shipped = mnn_llm.create(str(model_dir / "config.json"))
    shipped.load()
    result["readme_reply"] = shipped.response(README_PROMPT, False)
    out.write_text(json.dumps(result))


if __name__ == "__main__":
    run_mnn(Path(sys.argv[1]), Path(sys.argv[2]))
