"""Beyond the fixtures: models the real exporter makes from random shapes and quant settings.

Each seeded spec draws a family (qwen2, qwen3, llama), tied or untied embeddings, 4- or 8-bit
weights, symmetric or not, a block size and a small shape; the test builds the HuggingFace
model, exports it with `llmexport`, records MNN's greedy run in a subprocess and checks that
mnngpu on each available backend produces the same tokens and logits. Skipped where the
exporter (the `fixtures` extra) or `mnn` is not installed.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]
SEEDS = [11, 23, 37, 41]


def draw_spec(seed: int):
    from tools.make_fixtures import FixtureSpec

    rng = random.Random(seed)
    family = rng.choice(["qwen2", "qwen3", "llama"])
    head_dim = rng.choice([16, 32])
    kv_heads = rng.choice([1, 2])
    heads = kv_heads * rng.choice([1, 2, 4])  # divides every hidden size below, as transformers requires
    hidden = rng.choice([64, 128, 192])
    bits = rng.choice(["4", "8"])
    block = rng.choice(["0", "32", "64"])
    args = ["--quant_bit", bits, "--quant_block", block] + (["--sym"] if rng.random() < 0.4 else [])
    shape = {"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
             "head_dim": head_dim, "intermediate_size": rng.choice([128, 192, 256]),
             "num_hidden_layers": rng.choice([1, 2, 3])}
    return FixtureSpec(f"random_{seed}", family, args, tied=rng.random() < 0.5, hf_overrides=shape)


@lru_cache(maxsize=None)
def exported(seed: int, root: str) -> tuple[Path, dict, np.ndarray]:
    for module in ("torch", "transformers", "MNN.llm"):
        pytest.importorskip(module)
    import importlib.util

    if importlib.util.find_spec("llmexport") is None:
        pytest.skip("llmexport is not installed (pip install -e '.[fixtures]')")
    from tools import make_fixtures
    from tools.mnn_export import export_mnn

    spec = draw_spec(seed)
    base = Path(root) / spec.name
    hf_dir, out_dir = base / "hf", base / "out"
    tok = make_fixtures.build_tokenizer(hf_dir)
    make_fixtures.build_hf_model(spec, hf_dir, tok.get_vocab_size())
    export_mnn(hf_dir, out_dir, *spec.export_args)
    record = base / "oracle.json"
    prompts = make_fixtures.PROMPTS[1:3]
    subprocess.run([sys.executable, str(REPO / "tests" / "mnn_oracle.py"), str(out_dir), "--prompts-json",
                    json.dumps(prompts), "--steps", "12", "--json-out", str(record),
                    "--logits-out", str(base / "first.npy")], check=True, capture_output=True, timeout=300)
    return out_dir, json.loads(record.read_text()), np.load(base / "first.npy")


@pytest.mark.parametrize("seed", SEEDS)
def test_random_export_matches_mnn(seed, backend_type, tmp_path_factory):
    from mnngpu import llm as mnngpu_llm
    from tests.conformance.test_fixture_models import LOGIT_TOLERANCE, greedy

    model_dir, ref, first_logits = exported(seed, str(tmp_path_factory.getbasetemp() / "random_exports"))
    model = mnngpu_llm.create(model_dir)
    model.set_config({"backend_type": backend_type, "precision": "high", "memory": "high", "thread_num": 2})
    model.load()
    for k, prompt in enumerate(ref["prompts"]):
        tokens, first = greedy(model, prompt["ids"], len(prompt["greedy"]))
        spec = draw_spec(seed)
        where = f"{spec.family} tied={spec.tied} {spec.export_args} {spec.hf_overrides}"
        assert np.abs(first - first_logits[k]).max() <= LOGIT_TOLERANCE * first_logits[k].std(), where
        assert tokens == prompt["greedy"], where
