"""Each fixture against its HuggingFace source run in float64, with the weights rounded the way
the exporter stores them: mnngpu's first-step logits are no further from that truth than MNN's.

The exporter (llmexport) quantizes every linear weight row by row in blocks along the input
dimension: asymmetric blocks store min + round((w - min) / scale) * scale with
scale = (max - min) / (2^bits - 1); symmetric blocks store clamp(round(w / scale)) * scale with
scale = max|w| / (2^(bits-1) - 1); a block size that does not divide the row is halved until it
does, and block 0 means one block per row. `--quant_bit 16` stores fp16. The lm_head uses the same
bits; embeddings are bf16, or quantized the same way with `--embed_bit`, or, when the lm_head is
tied to them, the lm_head's quantized rows; Gemma 4's per-layer embedding table is bf16. Norms and
biases stay float.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conformance.test_fixture_models import load
from tests.conftest import MODEL_NAMES, hf_dir, reference

# the engine may be this much (in logit std units) further from the float64 truth than MNN is
SLACK = 1e-3


def export_options(args: list[str]) -> dict:
    options = {"quant_bit": 4, "quant_block": 64, "embed_bit": 16, "sym": "--sym" in args}
    for flag, value in zip(args, args[1:]):
        if flag.startswith("--") and flag[2:] in options and flag != "--sym":
            options[flag[2:]] = int(value)
    return options


def divide(values: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """values / scale, with level 0 for a constant block (scale 0: the padding row's zeros)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.nan_to_num(values / scale, nan=0.0)


def fake_quantize(weight: np.ndarray, bits: int, block: int, symmetric: bool) -> np.ndarray:
    """The values the exporter stores for `weight` (out, in), in float64."""
    if bits == 16:
        return weight.astype(np.float16).astype(np.float64)
    rows, cols = weight.shape
    size = cols if block == 0 else block
    while cols % size:
        size //= 2
    w = weight.astype(np.float32).reshape(rows, cols // size, size)
    top = 2 ** (bits - 1) - 1
    if symmetric:
        scale = np.abs(w).max(axis=-1, keepdims=True) / np.float32(top)
        levels = np.clip(np.round(divide(w, scale)), -top, top)
        return (levels.astype(np.float64) * scale).reshape(rows, cols)
    low = w.min(axis=-1, keepdims=True)
    scale = (w.max(axis=-1, keepdims=True) - low) / np.float32(2 * top + 1)
    levels = np.clip(np.round(divide(w - low, scale)), 0, 2 * top + 1)
    return (low.astype(np.float64) + levels * scale.astype(np.float64)).reshape(rows, cols)


def float64_source_model(name: str, options: dict):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir(name), dtype=torch.float64,
                                                              experts_implementation="eager")
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    tied = head.weight.data_ptr() == embed.weight.data_ptr()
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Embedding):
                continue
            # nn.Linear weights, a MoE router's weight, and the experts' stacked [expert, out, in] weights
            for weight in module.parameters(recurse=False):
                if weight.ndim >= 2:
                    rows = weight.numpy().reshape(-1, weight.shape[-2], weight.shape[-1])
                    stored = np.stack([fake_quantize(m, options["quant_bit"], options["quant_block"],
                                                     options["sym"]) for m in rows])
                    weight.copy_(torch.from_numpy(stored.reshape(weight.shape)))
        if not tied:
            table = embed.weight.float()
            if options["embed_bit"] == 16:
                stored = table.to(torch.bfloat16).double()
            else:
                stored = torch.from_numpy(fake_quantize(table.numpy(), options["embed_bit"],
                                                        options["quant_block"], options["sym"]))
            embed.weight.copy_(stored)
        per_layer = getattr(model.model, "embed_tokens_per_layer", None)
        if per_layer is not None:   # ple_embeddings_bf16.bin (llmexport's default --embed_bit 16)
            per_layer.weight.copy_(per_layer.weight.float().to(torch.bfloat16).double())
    return model.eval()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_no_further_from_the_float64_source_than_mnn(name):
    torch = pytest.importorskip("torch")
    ref, mnn_first = reference(name)
    truth_model = float64_source_model(name, export_options(ref["export_args"]))
    engine = load(name, "cpu")
    for k, prompt in enumerate(ref["prompts"]):
        with torch.no_grad():
            truth = truth_model(torch.tensor([prompt["ids"]])).logits[0, -1].numpy()
        engine.reset()
        ours = np.asarray(engine.forward(prompt["ids"]))[0, -1].astype(np.float64)
        scale = float(truth.std())
        mnn_distance = np.abs(mnn_first[k] - truth).max() / scale
        our_distance = np.abs(ours - truth).max() / scale
        assert our_distance <= mnn_distance + SLACK, (prompt["text"], our_distance, mnn_distance)
