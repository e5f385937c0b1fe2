"""LoRA (Llm.create_lora): the lora.mnn that `llmexport --lora_path --lora_split` writes, run on
the base model's weights, shared in memory as MNN's base module shares them.

The fixture qwen2_lora is a real export with a random adapter (tools/make_fixtures.py). Truth:
MNN's own runtime on the same lora.mnn, run live."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import numpy as np
import pytest

from mnngpu import llm
from mnngpu.errors import MnnGpuError, ModelFormatError
from tests.conftest import FIXTURES

MODEL_DIR = FIXTURES / "qwen2_lora"
ORACLE = FIXTURES.parents[1] / "mnn_oracle.py"
PROMPTS = json.loads((MODEL_DIR / "reference.json").read_text())["prompts"]


def load_base(folder=MODEL_DIR, **overrides):
    model = llm.create(folder / "config.json")
    model.set_config({"precision": "high", "thread_num": 2, **overrides})
    model.load()
    return model


def first_logits(model, ids) -> np.ndarray:
    model.reset()
    return np.asarray(model.forward(ids))[0, -1]


def static_module(model):
    return next(iter(model.pool.modules.values())).pipeline_module.static_module


@pytest.fixture(scope="module")
def mnn_lora_logits(tmp_path_factory) -> np.ndarray:
    pytest.importorskip("MNN")
    out = tmp_path_factory.mktemp("oracle")
    subprocess.run([sys.executable, str(ORACLE), str(MODEL_DIR), "--prompts-json", json.dumps([p["text"] for p in PROMPTS]),
                    "--steps", "1", "--config-json", json.dumps({"llm_model": "lora.mnn"}),
                    "--json-out", str(out / "r.json"), "--logits-out", str(out / "l.npy")],
                   check=True, capture_output=True, timeout=300)
    return np.load(out / "l.npy")


def test_the_lora_model_gives_mnns_logits_and_shares_the_base_weights(mnn_lora_logits):
    base = load_base()
    before = [first_logits(base, p["ids"]) for p in PROMPTS]
    lora = base.create_lora("lora.mnn")
    for prompt, want, base_logits in zip(PROMPTS, mnn_lora_logits, before):
        got = first_logits(lora, prompt["ids"])
        assert np.abs(got - want).max() < 1e-3 * want.std(), prompt["text"]
        assert np.abs(got - base_logits).max() > 0.1 * want.std()           # the adapter is applied
        np.testing.assert_array_equal(first_logits(base, prompt["ids"]), base_logits)   # the base is not
    shared, own = static_module(lora), static_module(base)
    assert set(shared.shared) == set(own.weight_nodes)
    for name, (_, node) in own.weight_nodes.items():
        assert shared.weight_nodes[name][1].weights is node.weights          # the same arrays, not copies


def test_a_damaged_lora_file_is_one_clear_error_and_the_folder_is_untouched(tmp_path):
    folder = tmp_path / "m"
    shutil.copytree(MODEL_DIR, folder, ignore=shutil.ignore_patterns("hf"))
    data = (folder / "lora.mnn").read_bytes()
    (folder / "lora.mnn").write_bytes(data[: len(data) // 2])
    before = sorted((p.name, p.read_bytes()) for p in folder.iterdir())
    base = load_base(folder)
    with pytest.raises(ModelFormatError) as caught:
        base.create_lora("lora.mnn")
    assert "lora.mnn" in str(caught.value)
    assert sorted((p.name, p.read_bytes()) for p in folder.iterdir()) == before


def test_a_lora_of_another_model_is_refused():
    base = load_base(FIXTURES / "qwen3_int4_b64")
    with pytest.raises(MnnGpuError) as caught:
        base.create_lora(MODEL_DIR / "lora.mnn")
    assert "lora.mnn" in str(caught.value)


def test_the_command_line_runs_a_lora_on_the_base_weights(capsys):
    from mnngpu.apps import cli

    def reply(*flags: str) -> str:
        code = cli.main(["run", str(MODEL_DIR), "--no-template", "-p", PROMPTS[0]["text"], "-n", "6",
                         "--sampler", "greedy", "--precision", "high", *flags])
        assert code == 0
        return capsys.readouterr().out

    with_lora = reply("--lora", "lora.mnn")
    assert with_lora == reply("--config", "llm_model=lora.mnn")   # the LoRA graph loaded on its own
    assert with_lora != reply()                                     # the adapter changes the reply
