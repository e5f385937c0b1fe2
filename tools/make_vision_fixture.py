"""Make the tiny real-export vision fixtures under tests/fixtures/vision/.

A random-weight Qwen2-VL (2 text layers, a 1-block vision tower of width 64) and a Qwen2.5-VL
(the same text model, a windowed and a full vision block of width 64) are built with
transformers, exported by MNN's real exporter (`llmexport`, offline, telemetry disabled), and
recorded with MNN's own runtime (tests/mnn_oracle.py): greedy tokens and first-step logits for
prompts with `<img>…</img>`, and the vision graph's image embeddings for the bundled test image.
Qwen3-VL and Qwen3.5 (Qwen3-VL's tower without deepstack, before 3 Gated-DeltaNet layers and a
full-attention layer) follow the same way; Qwen3.5's prompts are each recorded by a fresh MNN
instance, as MNN 3.6.1's reset() keeps the recurrent state.

Two settings of the export are changed for the recording, and written into the fixture so the
engine and MNN read the same: image_size 112 (the exporter's 420 makes 225 image tokens; 112 keeps
the fixture small and fast), and "mllm" precision/memory high (MNN's exporter asks for a CPU
vision runtime at precision normal / memory low, whose dynamic int8 activations the engine does
not reproduce). transformers >= 4.53 keeps the text model's sizes under text_config; llmexport
reads them at the top level, as the published Qwen2-VL config.json has them, so they are copied up.

    python -m tools.make_vision_fixture                   # every fixture
    python -m tools.make_vision_fixture qwen2_5_vl_int4   # only the named ones
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from tools import corpus
from tools.mnn_export import (
    copy_model_files,
    disable_converter_telemetry,
    export_mnn,
    folder_size,
    record_oracle,
    save_hf_tokenizer,
    set_export_settings,
    train_bpe_tokenizer,
)

REPO = Path(__file__).resolve().parent.parent
FIXTURES = REPO / "tests" / "fixtures" / "vision"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                  "<|image_pad|>", "<|video_pad|>"]
IMAGE = "image.png"
IMAGE_SIZE = 112
MLLM = {"backend_type": "cpu", "thread_num": 2, "precision": "high", "memory": "high"}
TEXT = {"hidden_size": 128, "intermediate_size": 192, "num_hidden_layers": 2, "num_attention_heads": 4,
        "num_key_value_heads": 2, "max_position_embeddings": 1024, "rms_norm_eps": 1e-6}
MROPE_SECTION = [4, 6, 6]    # head_dim 32: 16 rotary frequencies over time, height, width
VISION = {"depth": 1, "embed_dim": 64, "hidden_size": TEXT["hidden_size"], "num_heads": 4, "mlp_ratio": 2,
          "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 2, "initializer_range": 0.2}
# Qwen2.5-VL: two blocks, the first windowed (4x4 merged tokens), the second full (fullatt_block_indexes)
VISION_2_5 = {"depth": 2, "hidden_size": 64, "out_hidden_size": TEXT["hidden_size"], "intermediate_size": 96,
              "num_heads": 4, "fullatt_block_indexes": [1], "window_size": 112, "patch_size": 14,
              "spatial_merge_size": 2, "temporal_patch_size": 2, "initializer_range": 0.2}
# Qwen3-VL: 16x16 patches, a learned 8x8 position table interpolated to the grid, three blocks each
# feeding a deepstack merger (the exporter's LLM graph adds three deepstack rows to the first three
# layers' outputs, so the text model has three layers), and interleaved mrope
VISION_3 = {"depth": 3, "hidden_size": 64, "out_hidden_size": TEXT["hidden_size"], "intermediate_size": 96,
            "num_heads": 4, "num_position_embeddings": 64, "deepstack_visual_indexes": [0, 1, 2], "patch_size": 16,
            "spatial_merge_size": 2, "temporal_patch_size": 2, "initializer_range": 0.2}
TEXT_3 = {"num_hidden_layers": 3, "head_dim": 32}
MROPE_3 = {"mrope_section": [6, 5, 5], "mrope_interleaved": True}
# Qwen3.5: Qwen3-VL's tower without deepstack mergers, in front of 3 Gated-DeltaNet layers and one
# full-attention layer whose rotary covers half the head (8 frequencies, interleaved mrope)
VISION_3_5 = {"depth": 2, "hidden_size": 64, "out_hidden_size": TEXT["hidden_size"], "intermediate_size": 96,
              "num_heads": 4, "num_position_embeddings": 64, "patch_size": 16, "spatial_merge_size": 2,
              "temporal_patch_size": 2, "initializer_range": 0.2}
TEXT_3_5 = {"num_hidden_layers": 4, "head_dim": 32, "full_attention_interval": 4, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
            "linear_num_value_heads": 4}
MROPE_3_5 = {"rope_type": "default", "partial_rotary_factor": 0.5, "mrope_section": [4, 2, 2],
             "mrope_interleaved": True}
SPECS = {   # fixture name: (family, transformers config class, model class, vision config, text changes, mrope)
    "qwen2_vl_int4": ("qwen2_vl", "Qwen2VLConfig", "Qwen2VLForConditionalGeneration", VISION, {},
                      {"type": "mrope", "mrope_section": MROPE_SECTION}),
    "qwen2_5_vl_int4": ("qwen2_5_vl", "Qwen2_5_VLConfig", "Qwen2_5_VLForConditionalGeneration", VISION_2_5, {},
                        {"type": "mrope", "mrope_section": MROPE_SECTION}),
    "qwen3_vl_int4": ("qwen3_vl", "Qwen3VLConfig", "Qwen3VLForConditionalGeneration", VISION_3, TEXT_3,
                      {"rope_type": "default", **MROPE_3}),
    "qwen3_5_int4": ("qwen3_5", "Qwen3_5Config", "Qwen3_5ForConditionalGeneration", VISION_3_5, TEXT_3_5,
                     MROPE_3_5),
}
# families whose recurrent state MNN 3.6.1's reset() keeps: each prompt is recorded by a fresh MNN
STATEFUL = {"qwen3_5"}
# {image} is the fixture's image path at recording and test time
PROMPTS = [
    "<|im_start|>user\n<img>{image}</img>What is in the picture?<|im_end|>\n<|im_start|>assistant\n",
    ("<|im_start|>user\nCompare <img><hw>56,84</hw>{image}</img> with the farmer.<|im_end|>\n"
     "<|im_start|>assistant\n"),
    "<|im_start|>user\nWhere does the farmer walk?<|im_end|>\n<|im_start|>assistant\n",
]


def block_size(name: str) -> int:
    """Pixels per merged token side: 2x2 patches of 14 (Qwen3-VL and Qwen3.5: of 16)."""
    return 32 if SPECS[name][0] in ("qwen3_vl", "qwen3_5") else 28


def aligned(size: int, unit: int) -> int:
    """MNN 3.6.1's rounding of a requested side to whole merged tokens."""
    return max(unit, round(size / unit) * unit)


def embed_sizes(name: str) -> list[list[int]]:
    """The aligned sizes the prompts resize the image to."""
    unit = block_size(name)
    return [[aligned(h, unit), aligned(w, unit)] for h, w in ((IMAGE_SIZE, IMAGE_SIZE), (56, 84))]


def make_test_image(path: Path) -> None:
    """84x56 RGB: smooth ramps, a hard diagonal edge and a checker corner, so resize and patch
    order both matter."""
    from PIL import Image

    y, x = np.mgrid[0:56, 0:84]
    red = (x * 3) % 256
    green = np.where(x + y > 60, 40 + y * 3, 220 - y * 2)
    blue = np.where(((x // 7) + (y // 7)) % 2 == 0, 230, 20)
    Image.fromarray(np.stack([red, green, blue], -1).astype(np.uint8)).save(path, optimize=True)


def build_hf_model(name: str, hf_dir: Path, vocab_size: int) -> None:
    import torch
    import transformers

    ids = {name: SPECIAL_TOKENS.index(token) for name, token in
           (("image_token_id", "<|image_pad|>"), ("video_token_id", "<|video_pad|>"),
            ("vision_start_token_id", "<|vision_start|>"), ("vision_end_token_id", "<|vision_end|>"))}
    eos = SPECIAL_TOKENS.index("<|im_end|>")
    _, config_class, model_class, vision, text_changes, mrope = SPECS[name]
    text = dict(TEXT, **text_changes, vocab_size=vocab_size, initializer_range=0.2, eos_token_id=eos, bos_token_id=0,
                pad_token_id=0, rope_scaling=mrope, rope_parameters={**mrope, "rope_theta": 1000000.0})
    config = getattr(transformers, config_class)(text_config=text, vision_config=vision, tie_word_embeddings=False,
                                                 **ids)
    torch.manual_seed(2)
    model = getattr(transformers, model_class)(config)   # float32 weights, as the text fixtures
    model.generation_config.eos_token_id = eos
    model.save_pretrained(hf_dir)
    saved = json.loads((hf_dir / "config.json").read_text())
    sizes = {key: text[key] for key in (*TEXT, *text_changes, "vocab_size")}
    # keys transformers consumed without saving them (Qwen3.5's full_attention_interval), which llmexport reads
    saved["text_config"].update({key: value for key, value in sizes.items() if key not in saved["text_config"]})
    saved.update(sizes)
    saved.update(rope_theta=1000000.0, rope_scaling=mrope)
    saved["text_config"].update(rope_theta=1000000.0, rope_scaling=mrope)
    (hf_dir / "config.json").write_text(json.dumps(saved, indent=1))


def set_fixture_settings(dest: Path) -> None:
    set_export_settings(dest, {"llm_config.json": {"image_size": IMAGE_SIZE}, "config.json": {"mllm": MLLM}})


def record_mnn(name: str, dest: Path) -> dict:
    image = dest / IMAGE
    prompts = [p.format(image=image) for p in PROMPTS]
    embed_args = ("--image-embeds", str(image), json.dumps(embed_sizes(name)),
                  "--image-embeds-out", str(dest / "image_embeds.npz"))
    if SPECS[name][0] in STATEFUL:
        result = record_oracle_fresh(dest, prompts, embed_args)
    else:
        result = record_oracle(dest, prompts, *embed_args)
    for prompt, template in zip(result["prompts"], PROMPTS):
        prompt["text"] = template
    return result


def record_oracle_fresh(dest: Path, prompts: list[str], embed_args: tuple[str, ...]) -> dict:
    """record_oracle with one MNN instance (one oracle process) per prompt, as the text fixtures of
    these families: MNN's reset() keeps a LinearAttention layer's state."""
    records, logits = [], []
    for k, text in enumerate(prompts):
        records.append(record_oracle(dest, [text], *(embed_args if k == 0 else ())))
        logits.append(np.load(dest / "first_logits.npy")[0])
    np.save(dest / "first_logits.npy", np.stack(logits))
    return {"settings": records[0]["settings"], "fresh_instance_per_prompt": True,
            "prompts": [record["prompts"][0] for record in records]}


def mnn_positions(ids: list[int], grids: list[tuple[int, int]]) -> np.ndarray:
    """int64 [3, len(ids)]: MNN 3.6.1's mrope positions, written from its rule: text takes the next
    index on all three axes; an image's merged grid (rows, columns) takes (base, base + row,
    base + column), base being the index after vision_start; then the index continues after the
    last width index."""
    pad = SPECIAL_TOKENS.index("<|image_pad|>")
    columns, grids, i = [], list(grids), 0
    while i < len(ids):
        following = columns[-1][2] + 1 if columns else 0
        if ids[i] == pad:
            rows, cols = grids.pop(0)
            columns += [(following, following + r, following + c) for r in range(rows) for c in range(cols)]
            i += rows * cols
        else:
            columns.append((following,) * 3)
            i += 1
    return np.array(columns, dtype=np.int64).T


def record_hf_reference(name: str, hf_dir: Path, dest: Path, reference: dict) -> None:
    """The HuggingFace model in float64 on the export's own weights (each linear layer's int4 weights
    dequantized, the bf16 embedding rows, MNN's image embeddings and Qwen3-VL deepstack features)
    at MNN's positions: first-step logits and 16 greedy tokens per prompt (decode positions: the
    cache length, as MNN's)."""
    import torch
    import transformers

    from mnngpu.format import read_net
    from mnngpu.format.quant import read_linear
    from mnngpu.format.weights import WeightFile

    model = getattr(transformers, SPECS[name][2]).from_pretrained(hf_dir, dtype=torch.float64).eval()
    text_model = model.model.language_model
    weights = WeightFile(dest / "llm.mnn.weight")
    for op in read_net(dest / "llm.mnn").ops:
        if op.type != "Convolution":
            continue
        linear = read_linear(weights, op.param, op.name)
        if op.name == "/lm/lm_head/Linear":
            target = model.lm_head
        else:   # /layers.N/self_attn/q_proj/Linear (Qwen3.5's linear layers: self_attn/in_proj_qkv, HF's linear_attn)
            layer, block, proj = op.name.strip("/").split("/")[:3]
            decoder = text_model.layers[int(layer.split(".")[1])]
            module = getattr(decoder, block, None) or decoder.linear_attn
            target = getattr(module, proj)
        with torch.no_grad():
            target.weight.copy_(torch.from_numpy(linear.dequantize().astype(np.float64)))
            if target.bias is not None:
                target.bias.copy_(torch.from_numpy(np.asarray(linear.bias, dtype=np.float64)))
    bf16 = np.fromfile(dest / "embeddings_bf16.bin", dtype="<u2").astype(np.uint32) << 16
    table = bf16.view(np.float32).reshape(-1, TEXT["hidden_size"]).astype(np.float64)
    embeds = np.load(dest / "image_embeds.npz")
    pad = SPECIAL_TOKENS.index("<|image_pad|>")
    unit = block_size(name)

    def logits_of(rows: np.ndarray, positions: np.ndarray, deepstack: np.ndarray | None) -> np.ndarray:
        extra = {}
        if deepstack is not None:   # Qwen3-VL: added to the first layers' outputs at the image rows
            mask = np.zeros(rows.shape[0], dtype=bool)
            mask[[i for i, token in enumerate(ids) if token == pad]] = True
            extra = {"visual_pos_masks": torch.from_numpy(mask)[None],
                     "deepstack_visual_embeds": list(torch.from_numpy(deepstack.astype(np.float64)))}
        with torch.no_grad():
            hidden = text_model(inputs_embeds=torch.from_numpy(rows)[None],
                                position_ids=torch.from_numpy(positions)[:, None, :], **extra).last_hidden_state
            return model.lm_head(hidden)[0, -1].numpy()

    firsts = []
    for prompt in reference["prompts"]:
        ids = prompt["ids"]
        sizes = [(aligned(h, unit), aligned(w, unit)) for h, w in _sizes_in(prompt["text"])]
        images = [embeds[f"{h}x{w}"] for h, w in sizes]
        deepstack = None
        if sizes and f"deepstack {sizes[0][0]}x{sizes[0][1]}" in embeds:
            deepstack = np.concatenate([embeds[f"deepstack {h}x{w}"] for h, w in sizes], axis=1)
        rows = table[ids]
        slots = [i for i, token in enumerate(ids) if token == pad]
        if slots:
            rows[slots] = np.concatenate(images).astype(np.float64)
        positions = mnn_positions(ids, [(h // unit, w // unit) for h, w in sizes])
        logits = logits_of(rows, positions, deepstack)
        firsts.append(logits.astype(np.float32))
        tokens = [int(np.argmax(logits))]
        while len(tokens) < len(prompt["greedy"]):
            rows = np.concatenate([rows, table[tokens[-1:]]])
            positions = np.concatenate([positions, np.full((3, 1), rows.shape[0] - 1)], axis=1)
            tokens.append(int(np.argmax(logits_of(rows, positions, deepstack))))
        prompt["hf_greedy"] = tokens
    np.save(dest / "hf_first_logits.npy", np.stack(firsts))


def _sizes_in(template: str) -> list[tuple[int, int]]:
    """The aligned size each <img> of a prompt template is resized to."""
    sizes = []
    for content in re.findall(r"<img>(.*?)</img>", template):
        sized = re.search(r"<hw>(\d+),(\d+)</hw>", content)
        sizes.append((int(sized.group(1)), int(sized.group(2))) if sized else (IMAGE_SIZE, IMAGE_SIZE))
    return sizes


def make_fixture(name: str) -> Path:
    dest = FIXTURES / name
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, out_dir = Path(tmp) / "hf", Path(tmp) / "out"
        tok = train_bpe_tokenizer(corpus.sentences(3000, seed=1), vocab_size=480, special_tokens=SPECIAL_TOKENS)
        save_hf_tokenizer(tok, hf_dir, eos="<|im_end|>", pad="<|endoftext|>")
        build_hf_model(name, hf_dir, tok.get_vocab_size())
        export_mnn(hf_dir, out_dir, "--quant_bit", "4", "--quant_block", "64")
        copy_model_files(out_dir, dest)
        for file in ("visual.mnn", "visual.mnn.weight"):
            shutil.copy2(out_dir / file, dest / file)
        make_test_image(dest / IMAGE)
        set_fixture_settings(dest)
        reference = record_mnn(name, dest)
        record_hf_reference(name, hf_dir, dest, reference)
    reference.update(export_args=["--quant_bit", "4", "--quant_block", "64"], family=SPECS[name][0],
                     fixture_settings={"image_size": IMAGE_SIZE, "mllm": MLLM}, embed_sizes=embed_sizes(name))
    (dest / "reference.json").write_text(json.dumps(reference, indent=1, ensure_ascii=False) + "\n")
    return dest


def main() -> None:
    names = sys.argv[1:] or list(SPECS)
    disable_converter_telemetry()
    for name in names:
        print(f"{name}: {folder_size(make_fixture(name)) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
