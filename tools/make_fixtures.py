"""Make the tiny real-export model fixtures under tests/fixtures/models/.

For each spec: build a tiny HuggingFace model (random weights, fixed seed) with a byte-level
BPE tokenizer trained on tools/corpus.py, export it with MNN's real exporter, and record what
MNN's own runtime does on it (tests/mnn_oracle.py, in a subprocess). The HuggingFace source
is committed beside the export as `hf/`, so weight tests can compare against it. Each prompt's record
also keeps every greedy step's top 8 logits ("steps_top"), and one prompt's every all_logits row's
("rows_top"): tools/record_steps_top.py.

    pip install -e '.[fixtures,test]'
    python -m tools.make_fixtures            # all fixtures
    python -m tools.make_fixtures qwen3      # only the named ones

The `_c4` fixtures are exports in MNN's newer format (C4 fusion: FusedLinear, RoPE, GatedRMSNorm,
Attention with output_c4, LinearAttention gate_fold; fp16 quantization scales), made from another
fixture's committed `hf/` (reference.json's "hf_from"; they hold no `hf/` of their own) by MNN's own
llmexport.py and MNNConvert at tools/build_mnn.py's MNN_COMMIT, and recorded by that commit's runtime
(tools/mnn_recorder.cpp, a fresh instance per prompt, the same prompt ids as the source fixture; each
prompt also keeps the top 8 ids and logits of every greedy step as "steps_top"). They need that
build (tools/head_export.py):

    python -m tools.build_mnn MNN_GIT_DIR WORKDIR
    MNN_HEAD_BUILD=WORKDIR/build-<commit9> python -m tools.make_fixtures qwen3_c4
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tools import corpus, head_export
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
FIXTURES = REPO / "tests" / "fixtures" / "models"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
HF_FILES = ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json",
            "tokenizer_config.json", "chat_template.jinja")

PROMPTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "<|im_start|>user\nWhere does the farmer walk?<|im_end|>\n<|im_start|>assistant\n",
    "café 日本語 👍🏽 12345",
    # longer than one 100-token prefill chunk, so fixed-shape backends must chunk it
    " ".join(corpus.sentences(14, seed=99, extras=False)),
]


@dataclass
class FixtureSpec:
    name: str
    family: str                      # HF model_type: qwen2 | llama | phi3 | ...
    export_args: list[str]
    tied: bool = False
    hf_overrides: dict = field(default_factory=dict)
    lora: bool = False               # also export lora.mnn from a random adapter (--lora_path --lora_split)
    eagle: bool = False              # also export an EAGLE-3 draft head (--eagle_path): eagle*.mnn
    # state MNN's reset() keeps (a LinearAttention layer's; Gemma 4's per-layer embedding rows of the
    # last step, which its next prompt then reads): each prompt gets a fresh MNN instance
    stateful: bool = False
    # a family whose HF model always carries a vision tower (Qwen3.5): this tiny tower's config; the
    # text sizes then go under text_config
    vision: dict | None = None
    # a family the exporter reads as a composite config (Gemma 4) although it has no tower: the text
    # sizes go under text_config, the towers' configs are null
    composite: bool = False
    settings: dict = field(default_factory=dict)   # {export file: {key: value}} the fixture changes
    # the exporter: "0.0.5", the `llmexport` wheel's (recorded by MNN 3.6.1's wheel); "head", MNN's own
    # at tools/build_mnn.py's commit (recorded by that commit's runtime: tools/head_export.py)
    exporter: str = "0.0.5"
    # export the committed hf/ of this fixture instead of building one (a "head" spec's source)
    hf_from: str | None = None

    def __post_init__(self):
        if (self.exporter == "head") != (self.hf_from is not None):
            raise ValueError(f"{self.name}: a 'head' spec exports another fixture's hf/ (hf_from), "
                             "and only a 'head' spec does")


QWEN3_5_TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 4, "num_attention_heads": 2,
                "num_key_value_heads": 1, "head_dim": 32, "linear_conv_kernel_dim": 4, "linear_key_head_dim": 16,
                "linear_value_head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
                "full_attention_interval": 4,
                "rope_parameters": {"rope_type": "default", "rope_theta": 1e6, "partial_rotary_factor": 0.25,
                                    "mrope_section": [2, 1, 1], "mrope_interleaved": True}}
QWEN3_5_VISION = {"depth": 1, "hidden_size": 32, "out_hidden_size": QWEN3_5_TEXT["hidden_size"],
                  "intermediate_size": 96, "num_heads": 2, "num_position_embeddings": 64, "patch_size": 16,
                  "spatial_merge_size": 2, "temporal_patch_size": 2, "initializer_range": 0.2}
# the vision token ids a composite config must name: ordinary ids of the tiny tokenizer (no image is fed)
VISION_TOKEN_IDS = {"image_token_id": 3, "video_token_id": 4, "vision_start_token_id": 5, "vision_end_token_id": 6}
WITHOUT_VISION = {"llm_config.json": {"is_visual": False, "has_deepstack": False}}
# Gemma 4 with one head width: the real shape's wider full-attention heads (global_head_dim) make the
# exporter fail (`'head_dim' is a per-layer attribute`), and an empty per_layer_config keeps them equal
GEMMA4_TEXT = {"hidden_size": 64, "intermediate_size": 96, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 32, "per_layer_config": {}, "hidden_size_per_layer_input": 64, "sliding_window": 8,
               "layer_types": ["sliding_attention", "full_attention"], "final_logit_softcapping": 30.0}

INT4_B64 = ["--quant_bit", "4", "--quant_block", "64"]
SPECS = [
    FixtureSpec("qwen2_int4_b64", "qwen2", ["--quant_bit", "4", "--quant_block", "64"]),
    # the exporter taps the inputs of layers 2, n//2 and n-3 for EAGLE-3: 7 layers make them distinct
    # (narrower layers keep the fixture small)
    FixtureSpec("qwen2_eagle3_int4", "qwen2", ["--quant_bit", "4", "--quant_block", "64"], eagle=True,
                hf_overrides={"num_hidden_layers": 7, "hidden_size": 64, "intermediate_size": 96,
                              "num_attention_heads": 2, "num_key_value_heads": 1}),
    FixtureSpec("qwen3_int4_b64", "qwen3", ["--quant_bit", "4", "--quant_block", "64"], hf_overrides={"head_dim": 32}),
    FixtureSpec("llama_tied_int4", "llama", ["--quant_bit", "4", "--quant_block", "64"], tied=True),
    FixtureSpec("qwen2_int8_b0", "qwen2", ["--quant_bit", "8", "--quant_block", "0"]),
    FixtureSpec("qwen2_lora", "qwen2", ["--quant_bit", "4", "--quant_block", "64"], lora=True),
    FixtureSpec("llama_sym_int4", "llama", ["--quant_bit", "4", "--quant_block", "32", "--sym"]),
    FixtureSpec("qwen2_embed_int8", "qwen2", ["--quant_bit", "4", "--quant_block", "64", "--embed_bit", "8"]),
    FixtureSpec("qwen3_embed_int4", "qwen3", ["--quant_bit", "8", "--quant_block", "64", "--embed_bit", "4"],
                hf_overrides={"head_dim": 32}),
    FixtureSpec("qwen2_int8_asym_b128", "qwen2", ["--quant_bit", "8", "--quant_block", "128"]),
    FixtureSpec("llama_sym_int4_b128", "llama", ["--quant_bit", "4", "--quant_block", "128", "--sym"]),
    FixtureSpec("qwen3_fp16", "qwen3", ["--quant_bit", "16"], hf_overrides={"head_dim": 32}),
    # a real model's head width (Gemma's 256; Qwen's 128 lies between) on a narrow model: one head of
    # each kind and one layer keep the fixture small (a newer-format export of it is not: that exporter
    # writes a rotary table of 1024 positions into llm.mnn, 2 MB at this width)
    FixtureSpec("qwen3_head256_int4", "qwen3", INT4_B64,
                hf_overrides={"head_dim": 256, "num_attention_heads": 1, "num_key_value_heads": 1,
                              "num_hidden_layers": 1, "max_position_embeddings": 256}),
    FixtureSpec("llama_int4_b0", "llama", ["--quant_bit", "4", "--quant_block", "0"]),
    FixtureSpec("qwen3_sym_int8_b32", "qwen3", ["--quant_bit", "8", "--quant_block", "32", "--sym"],
                hf_overrides={"head_dim": 32}),
    FixtureSpec("mistral_int4_b64", "mistral", ["--quant_bit", "4", "--quant_block", "64"],
                hf_overrides={"sliding_window": 64}),
    FixtureSpec("gemma2_tied_int4", "gemma2", ["--quant_bit", "4", "--quant_block", "64"], tied=True,
                hf_overrides={"head_dim": 32, "sliding_window": 64}),
    # the exporter computes rotary angles from rope_theta alone: llama3 scaling is not in the export
    FixtureSpec("llama3_scaled_int4", "llama", ["--quant_bit", "4", "--quant_block", "64"],
                hf_overrides={"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                                               "high_freq_factor": 4.0, "original_max_position_embeddings": 256}}),
    FixtureSpec("phi3_int4_b32", "phi3", ["--quant_bit", "4", "--quant_block", "32"]),
    FixtureSpec("phi2_int8", "phi", ["--quant_bit", "8", "--quant_block", "64"]),
    FixtureSpec("hunyuan_int4", "hunyuan_v1_dense", ["--quant_bit", "4", "--quant_block", "64"],
                hf_overrides={"head_dim": 32}),
    FixtureSpec("qwen3_moe_int4_b64", "qwen3_moe", ["--quant_bit", "4", "--quant_block", "64"],
                hf_overrides={"head_dim": 32, "num_experts": 4, "num_experts_per_tok": 2,
                              "moe_intermediate_size": 64, "norm_topk_prob": True}),
    # every gemma3 layer slides (attention_type sliding); a window of 8 cuts every test prompt
    FixtureSpec("gemma3_sliding_int4", "gemma3_text", ["--quant_bit", "4", "--quant_block", "64"],
                hf_overrides={"head_dim": 32, "sliding_window": 8}),
    # one sliding and one full layer (attention_type mix, the full layer last as in gemma3's pattern)
    FixtureSpec("gemma3_mix_int4", "gemma3_text", ["--quant_bit", "4", "--quant_block", "64"],
                hf_overrides={"head_dim": 32, "sliding_window": 8,
                              "layer_types": ["sliding_attention", "full_attention"]}),
    # short-convolution layers (LinearAttention, mode short_conv) around one attention layer, tied
    FixtureSpec("lfm2_int4_b64", "lfm2", ["--quant_bit", "4", "--quant_block", "64"], tied=True, stateful=True,
                hf_overrides={"num_hidden_layers": 3, "layer_types": ["conv", "full_attention", "conv"],
                              "intermediate_size": 128, "block_auto_adjust_ff_dim": False}),
    # three Gated-DeltaNet layers (LinearAttention, mode gated_delta_rule, 2 k heads for 4 v heads) and a
    # full-attention layer; the exporter needs full_attention_interval and an mrope_section. The vision
    # tower is left out of the fixture (visual.mnn, and hf/ keeps the text model alone) and the config
    # says so (is_visual, has_deepstack false): the text model does not use it, and this graph takes no
    # deepstack_embeds although the exporter says it has them
    FixtureSpec("qwen3_5_int4_b64", "qwen3_5", ["--quant_bit", "4", "--quant_block", "64"], stateful=True,
                hf_overrides=QWEN3_5_TEXT, vision=QWEN3_5_VISION, settings=WITHOUT_VISION),
    FixtureSpec("qwen3_5_moe_int4_b64", "qwen3_5_moe", ["--quant_bit", "4", "--quant_block", "64"], stateful=True,
                hf_overrides={**QWEN3_5_TEXT, "num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 64,
                              "shared_expert_intermediate_size": 64},
                vision=QWEN3_5_VISION, settings=WITHOUT_VISION),
    # per-layer embeddings (ple_embeddings_bf16.bin), a sliding and a full layer with their own rotary
    # (proportional, a quarter of the head, on the full layer), tied, logits soft-capped
    FixtureSpec("gemma4_int4_b64", "gemma4", ["--quant_bit", "4", "--quant_block", "64"], tied=True,
                stateful=True, composite=True, hf_overrides=GEMMA4_TEXT),
    # MNN's newer export format (C4 fusion on, fp16 scales: the exporter's defaults at its commit) of
    # the fixtures above, recorded by that commit's runtime
    FixtureSpec("qwen3_c4", "qwen3", INT4_B64, exporter="head", hf_from="qwen3_int4_b64"),
    FixtureSpec("qwen2_c4", "qwen2", INT4_B64, exporter="head", hf_from="qwen2_int4_b64"),
    FixtureSpec("qwen3_c4_unfused_ln", "qwen3", [*INT4_B64, "--disable_fuse_ln_proj"], exporter="head",
                hf_from="qwen3_int4_b64"),
    FixtureSpec("qwen3_c4_unfused_proj", "qwen3",
                [*INT4_B64, "--disable_fuse_qkv_proj", "--disable_fuse_gate_up_proj"], exporter="head",
                hf_from="qwen3_int4_b64"),
    # exported from the text model alone (its hf/): the export has no vision settings to turn off
    FixtureSpec("qwen3_5_c4", "qwen3_5", INT4_B64, stateful=True, exporter="head", hf_from="qwen3_5_int4_b64"),
    FixtureSpec("qwen3_5_c4_unfused_gate", "qwen3_5", [*INT4_B64, "--disable_fuse_linear_attn_gate"],
                stateful=True, exporter="head", hf_from="qwen3_5_int4_b64"),
    FixtureSpec("qwen3_moe_c4", "qwen3_moe", INT4_B64, exporter="head", hf_from="qwen3_moe_int4_b64"),
    # partial rotary (half of each head)
    FixtureSpec("phi2_c4", "phi", ["--quant_bit", "8", "--quant_block", "64"], exporter="head",
                hf_from="phi2_int8"),
    # the exporter's other weight options at that commit (its llmexport.py refuses 5 and 6 bits)
    FixtureSpec("qwen3_c4_q2_embed4_lm8", "qwen3",
                ["--quant_bit", "2", "--quant_block", "64", "--embed_bit", "4", "--lm_quant_bit", "8"],
                exporter="head", hf_from="qwen3_int4_b64"),
    FixtureSpec("qwen3_c4_q3_sym_b0_scale32", "qwen3",
                ["--quant_bit", "3", "--quant_block", "0", "--sym", "--scale_bit", "32", "--embed_bit", "8"],
                exporter="head", hf_from="qwen3_int4_b64"),
]

TINY_SHAPE = dict(hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=1024, initializer_range=0.2)


def build_tokenizer(hf_dir: Path):
    tok = train_bpe_tokenizer(corpus.sentences(3000, seed=1), vocab_size=480, special_tokens=SPECIAL_TOKENS)
    save_hf_tokenizer(tok, hf_dir, eos="<|im_end|>", pad="<|endoftext|>")
    return tok


def build_hf_model(spec: FixtureSpec, hf_dir: Path, vocab_size: int) -> None:
    import torch
    import transformers

    eos = SPECIAL_TOKENS.index("<|im_end|>")
    text = dict(vocab_size=vocab_size, eos_token_id=eos, bos_token_id=0, pad_token_id=0,
                **{**TINY_SHAPE, **spec.hf_overrides})
    torch.manual_seed(sum(map(ord, spec.name)))
    # float32, so the exporter quantizes exact source values: every stored weight is then within
    # half a quantization step of the committed source tensor
    if spec.composite:
        text["vocab_size_per_layer_input"] = vocab_size
        config = transformers.AutoConfig.for_model(spec.family, text_config=text, vision_config=None,
                                                   audio_config=None, tie_word_embeddings=spec.tied)
        model = transformers.AutoModelForImageTextToText.from_config(config)
    elif spec.vision is None:
        config = transformers.AutoConfig.for_model(spec.family, tie_word_embeddings=spec.tied, torch_dtype="float32",
                                                   **text)
        model = transformers.AutoModelForCausalLM.from_config(config)
    else:
        config = transformers.AutoConfig.for_model(spec.family, text_config=text, vision_config=spec.vision,
                                                   tie_word_embeddings=spec.tied, **VISION_TOKEN_IDS)
        model = transformers.AutoModelForImageTextToText.from_config(config)
    model.generation_config.eos_token_id = eos
    model.save_pretrained(hf_dir)
    if spec.vision is not None:
        restore_text_keys(hf_dir / "config.json", spec.hf_overrides)


def save_text_model(hf_dir: Path, dest: Path) -> None:
    """Overwrite dest's model and config with the text model alone (transformers' causal LM for the
    text config, the same weights): the vision tower the exporter needed stays out of the fixture."""
    import transformers

    model = transformers.AutoModelForImageTextToText.from_pretrained(hf_dir)
    text = transformers.AutoModelForCausalLM.from_config(model.config.text_config)
    text.model.load_state_dict(model.model.language_model.state_dict())
    text.lm_head.load_state_dict(model.lm_head.state_dict())
    text.generation_config = model.generation_config
    text.save_pretrained(dest)


def restore_text_keys(config_path: Path, text: dict) -> None:
    """Write back under text_config the keys transformers consumed without saving them (Qwen3.5's
    full_attention_interval becomes layer_types), which llmexport reads."""
    saved = json.loads(config_path.read_text())
    saved["text_config"].update({key: value for key, value in text.items() if key not in saved["text_config"]})
    config_path.write_text(json.dumps(saved, indent=1))


LORA_RANK, LORA_ALPHA, LORA_TARGETS = 4, 8, ("q_proj", "v_proj")
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")


def build_lora_adapter(spec: FixtureSpec, adapter_dir: Path) -> None:
    """A PEFT-layout LoRA adapter with random A and B (B nonzero, so the adapter changes the
    output) for q_proj and v_proj of every layer: what `llmexport --lora_path` reads."""
    import torch
    from safetensors.torch import save_file

    shape = {**TINY_SHAPE, **spec.hf_overrides}
    head_dim = shape.get("head_dim", shape["hidden_size"] // shape["num_attention_heads"])
    outputs = {"q_proj": shape["num_attention_heads"] * head_dim, "v_proj": shape["num_key_value_heads"] * head_dim}
    generator = torch.Generator().manual_seed(7)
    tensors = {}
    for layer in range(shape["num_hidden_layers"]):
        for target in LORA_TARGETS:
            stem = f"base_model.model.model.layers.{layer}.self_attn.{target}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(LORA_RANK, shape["hidden_size"], generator=generator) * 0.1
            tensors[f"{stem}.lora_B.weight"] = torch.randn(outputs[target], LORA_RANK, generator=generator) * 0.1
    adapter_dir.mkdir(parents=True)
    save_file(tensors, str(adapter_dir / "adapter_model.safetensors"))
    config = {"peft_type": "LORA", "r": LORA_RANK, "lora_alpha": LORA_ALPHA, "target_modules": list(LORA_TARGETS)}
    (adapter_dir / "adapter_config.json").write_text(json.dumps(config, indent=1))


EAGLE_DRAFT_VOCAB, EAGLE_FIT_STEPS = 128, 48
EAGLE_FILES = ("eagle.mnn", "eagle.mnn.weight", "eagle_fc.mnn", "eagle_fc.mnn.weight", "eagle_d2t.mnn")
# the fixture prompts and the repetitive text the speculative tests decode
EAGLE_FIT_PROMPTS = PROMPTS + ["The river looks at a warm loaf of bread in the spring. " * 6]


def _eagle_fit_data(export_dir: Path):
    """What a draft head must guess, from mnngpu's greedy run of an export (which agrees with
    MNN's): at each position from the last prompt token on, the hidden_states output (the inputs
    of layers 2, n//2 and n-3, as llmexport taps them) and the token the model picks one position
    later."""
    from mnngpu.llm import create, graph_feeds

    llm = create(export_dir / "config.json")
    llm.set_config({"speculative_type": "", "sampler_type": "greedy", "precision": "high"})
    llm.load()
    taps, targets = [], []
    for text in EAGLE_FIT_PROMPTS:
        llm.reset()
        ids = llm.tokenizer_encode(text)
        ids += llm.generate(ids, EAGLE_FIT_STEPS, stop_ids=())
        llm.reset()
        embeds = llm.embedding.rows(ids).reshape(len(ids), 1, -1)
        llm.runtime.kv_meta.add = len(ids)
        logits, hidden = llm.pool.select(len(ids), True).forward(
            graph_feeds(embeds, 0, True, llm.attention_mask), ["logits", "hidden_states"])
        llm.runtime.kv_meta.sync()
        picked = np.asarray(logits).reshape(len(ids), -1).argmax(-1)
        first = len(llm.tokenizer_encode(text)) - 1
        taps.append(np.asarray(hidden).reshape(len(ids), -1)[first:-1])
        targets.append(picked[first + 1:])
    return np.concatenate(taps).astype(np.float64), np.concatenate(targets)


def build_eagle_head(spec: FixtureSpec, tok, eagle_dir: Path, fit_from: Path | None = None) -> None:
    """An EAGLE-3 draft head in the layout `llmexport --eagle_path` reads: one decoder layer with
    small random weights (seeded). With `fit_from` (an export of the base model), its draft
    vocabulary is the tokens the base model's greedy continuations of the test prompts use most
    (d2t: draft id -> target id - draft id), and fc is a least-squares fit from the tapped hidden
    states to the token the base model picks next, read back by lm_head: so on those prompts its
    first draft is often right, as a trained head's is on text like its training data. Without
    it, fc is zero (a first export, to compute the taps)."""
    import torch
    from safetensors.torch import save_file

    shape = {**TINY_SHAPE, **spec.hf_overrides}
    hidden, heads, kv_heads = shape["hidden_size"], shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape.get("head_dim", hidden // heads)
    fc, lm_head = torch.zeros(hidden, 3 * hidden), torch.zeros(EAGLE_DRAFT_VOCAB, hidden)
    draft_ids = list(range(EAGLE_DRAFT_VOCAB))
    if fit_from is not None:
        taps, targets = _eagle_fit_data(fit_from)
        common = [int(t) for t, _ in Counter(targets.tolist()).most_common(EAGLE_DRAFT_VOCAB)]
        draft_ids = sorted(common + sorted(set(range(tok.get_vocab_size())) - set(common))[
            : EAGLE_DRAFT_VOCAB - len(common)])
        one_hot = (targets[:, None] == np.array(draft_ids)[None]).astype(np.float64)
        fit = np.linalg.lstsq(taps, one_hot, rcond=None)[0].T   # [draft vocab, 3 * hidden]
        # lm_head @ fc = fit at the layer's width (RMSNorm between them only scales a row)
        u, sigma, vt = np.linalg.svd(fit, full_matrices=False)
        root = np.sqrt(sigma[:hidden])
        head, reduce = u[:, :hidden] * root, root[:, None] * vt[:hidden]
        reduce *= 5.0 / np.sqrt(np.mean((taps @ reduce.T) ** 2))   # well above the layer's own part
        accuracy = float((np.array(draft_ids)[(taps @ reduce.T @ head.T).argmax(-1)] == targets).mean())
        print(f"{spec.name}: the EAGLE head guesses the base model's next greedy token {accuracy:.0%} of the "
              "time on the fitted positions (float64, before int4)")
        fc[: len(reduce)], lm_head[:, : len(reduce)] = torch.from_numpy(reduce), torch.from_numpy(head)
    generator = torch.Generator().manual_seed(11)

    def small(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=generator) * 0.02

    tensors = {
        "fc.weight": fc,
        "midlayer.hidden_norm.weight": torch.ones(hidden),
        "midlayer.input_layernorm.weight": torch.ones(hidden),
        "midlayer.post_attention_layernorm.weight": torch.ones(hidden),
        "midlayer.self_attn.q_proj.weight": small(heads * head_dim, 2 * hidden),
        "midlayer.self_attn.k_proj.weight": small(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.v_proj.weight": small(kv_heads * head_dim, 2 * hidden),
        "midlayer.self_attn.o_proj.weight": small(hidden, heads * head_dim),
        "midlayer.mlp.gate_proj.weight": small(shape["intermediate_size"], hidden),
        "midlayer.mlp.up_proj.weight": small(shape["intermediate_size"], hidden),
        "midlayer.mlp.down_proj.weight": small(hidden, shape["intermediate_size"]),
        "norm.weight": torch.ones(hidden),
        "lm_head.weight": lm_head,
        "d2t": torch.tensor(draft_ids, dtype=torch.int64) - torch.arange(EAGLE_DRAFT_VOCAB),
    }
    if eagle_dir.exists():
        shutil.rmtree(eagle_dir)
    eagle_dir.mkdir(parents=True)
    save_file(tensors, str(eagle_dir / "model.safetensors"))
    config = {"architectures": ["LlamaForCausalLMEagle3"], "hidden_size": hidden,
              "intermediate_size": shape["intermediate_size"], "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "rms_norm_eps": 1e-6, "hidden_act": "silu",
              "vocab_size": tok.get_vocab_size(), "draft_vocab_size": EAGLE_DRAFT_VOCAB}
    (eagle_dir / "config.json").write_text(json.dumps(config, indent=1))


def export_with_eagle_head(spec: FixtureSpec, tok, hf_dir: Path, out_dir: Path, eagle_dir: Path) -> None:
    """Export with a zero head, fit the head on that export's greedy runs, export again."""
    build_eagle_head(spec, tok, eagle_dir)
    export_mnn(hf_dir, out_dir, *spec.export_args, "--eagle_path", str(eagle_dir))
    build_eagle_head(spec, tok, eagle_dir, fit_from=out_dir)
    shutil.rmtree(out_dir)
    export_mnn(hf_dir, out_dir, *spec.export_args, "--eagle_path", str(eagle_dir))


# MNN 3.6.1's converter (the `MNN` wheel's): it writes no valid JSON for the newer format's op types
WHEEL_CONVERTER = [sys.executable, "-c", ("import sys; from MNN.tools import mnnconvert; "
                                         "sys.argv = ['mnnconvert'] + sys.argv[1:]; mnnconvert.main()")]


def mnn_graph_json(model_dir: Path, converter: list[str] | None = None) -> dict:
    """llm.mnn as the converter's JSON dump (`-f MNN --JsonFile`); converter: its argv (the wheel's)."""
    with tempfile.TemporaryDirectory() as tmp:
        dump = Path(tmp) / "llm.json"
        subprocess.run([*(converter or WHEEL_CONVERTER), "-f", "MNN", "--modelFile",
                        str(model_dir / "llm.mnn"), "--JsonFile", str(dump)], check=True, capture_output=True)
        return json.loads(dump.read_text())


# The newer converter's JSON dump of a newer-format fixture's llm.mnn, which MNN 3.6.1's converter cannot
# write: the truth tests/format/test_graph_reader.py compares the reader with. Long vectors (the inline
# rotary tables) are kept as a summary, so the file stays small.
CONVERTER_TRUTH = "mnnconvert.json"
SUMMARY_OVER = 64


def summarized(value):
    """`value` (the converter's JSON) with every list longer than SUMMARY_OVER replaced by
    {"summary_of": length, "head": first 4, "tail": last 4, "sum": sum}."""
    if isinstance(value, dict):
        return {key: summarized(item) for key, item in value.items()}
    if isinstance(value, list):
        if len(value) > SUMMARY_OVER and all(isinstance(item, (int, float)) for item in value):
            return {"summary_of": len(value), "head": value[:4], "tail": value[-4:], "sum": float(sum(value))}
        return [summarized(item) for item in value]
    return value


def mnn_op_counts(model_dir: Path,
                  converter: list[str] | None = None) -> tuple[dict[str, int], dict[str, int]]:
    """Op counts of the main graph and of all its subgraphs (a MoE export's experts), by type."""
    graph = mnn_graph_json(model_dir, converter)
    sub_ops = [op["type"] for sub in graph.get("subgraphs", []) for op in sub["nodes"]]
    return (dict(sorted(Counter(op["type"] for op in graph["oplists"]).items())),
            dict(sorted(Counter(sub_ops).items())))


def record_oracle_fresh(model_dir: Path, prompts: list[str]) -> dict:
    """record_oracle with one MNN instance (one oracle process) per prompt: MNN's reset() keeps a
    LinearAttention layer's state, so a prompt recorded after another would start from its state."""
    records, logits = [], []
    for text in prompts:
        records.append(record_oracle(model_dir, [text]))
        logits.append(np.load(model_dir / "first_logits.npy")[0])
    np.save(model_dir / "first_logits.npy", np.stack(logits))
    return {"settings": records[0]["settings"], "fresh_instance_per_prompt": True,
            "prompts": [record["prompts"][0] for record in records]}


def to_readable_json(value: dict) -> str:
    """JSON with one prompt record per line, so diffs of regenerated fixtures stay readable."""
    prompts = value["prompts"]
    head = json.dumps({k: v for k, v in value.items() if k != "prompts"}, indent=1, ensure_ascii=False)
    rows = ",\n  ".join(json.dumps(p, ensure_ascii=False) for p in prompts)
    return head[:-2] + ',\n "prompts": [\n  ' + rows + "\n ]\n}\n"


# the prompt whose every prefill row MNN's newer runtime records (all_logits), top 8 logits a row
ALL_ROWS_PROMPT = 1


def make_head_fixture(spec: FixtureSpec) -> Path:
    """Export spec.hf_from's committed hf/ with MNN's newer exporter and record the newer runtime on
    the source fixture's prompt ids (the tokenizer is the same), with the source's settings."""
    dest, source = FIXTURES / spec.name, FIXTURES / spec.hf_from
    source_reference = json.loads((source / "reference.json").read_text())
    if [prompt["text"] for prompt in source_reference["prompts"]] != PROMPTS:
        raise ValueError(f"{spec.hf_from}'s reference.json holds other prompts than PROMPTS: remake it first")
    if (source_reference["family"], source_reference["tied"]) != (spec.family, spec.tied):
        raise ValueError(f"{spec.name}: family and tied differ from {spec.hf_from}'s")
    hf_config = json.loads((source / "hf" / "config.json").read_text())
    vocab = hf_config.get("text_config", hf_config)["vocab_size"]
    with tempfile.TemporaryDirectory() as tmp:
        out_dir = Path(tmp) / "out"
        head_export.export_head(source / "hf", out_dir, *spec.export_args)
        copy_model_files(out_dir, dest)   # not the exporter's llm.mnn.json, export_args.json, onnx/
    set_export_settings(dest, spec.settings)
    settings = source_reference["settings"]
    prompts, first_logits = head_export.record_head(
        dest, [(prompt["text"], prompt["ids"]) for prompt in source_reference["prompts"]], settings, vocab)
    np.save(dest / "first_logits.npy", first_logits)
    prompts[ALL_ROWS_PROMPT]["rows_top"] = head_export.record_prefill_rows(
        dest / "config.json", prompts[ALL_ROWS_PROMPT]["ids"], settings)
    reference = {"settings": settings, "fresh_instance_per_prompt": True,
                 "recorded_by": head_export.RECORDED_BY, "exported_by": head_export.EXPORTED_BY,
                 "hf_from": spec.hf_from, "export_args": spec.export_args, "family": spec.family,
                 "tied": spec.tied}
    graph = mnn_graph_json(dest, head_export.converter_argv())
    (dest / CONVERTER_TRUTH).write_text(json.dumps(summarized(graph), separators=(",", ":")) + "\n")
    reference["op_counts"], subgraph_counts = mnn_op_counts(dest, head_export.converter_argv())
    if subgraph_counts:
        reference["subgraph_op_counts"] = subgraph_counts
    reference["prompts"] = prompts
    (dest / "reference.json").write_text(to_readable_json(reference))
    return dest


def make_fixture(spec: FixtureSpec) -> Path:
    if spec.exporter == "head":
        return make_head_fixture(spec)
    dest = FIXTURES / spec.name
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, out_dir = Path(tmp) / "hf", Path(tmp) / "out"
        tok = build_tokenizer(hf_dir)
        build_hf_model(spec, hf_dir, vocab_size=tok.get_vocab_size())
        extra = []
        if spec.lora:
            build_lora_adapter(spec, Path(tmp) / "adapter")
            extra = ["--lora_path", str(Path(tmp) / "adapter"), "--lora_split"]
        if spec.eagle:
            export_with_eagle_head(spec, tok, hf_dir, out_dir, Path(tmp) / "eagle")
        else:
            export_mnn(hf_dir, out_dir, *spec.export_args, *extra)
        copy_model_files(out_dir, dest)
        for table in out_dir.glob("ple_embeddings_*.bin"):
            shutil.copy2(table, dest / table.name)
        set_export_settings(dest, spec.settings)
        (dest / "hf").mkdir()
        for name in HF_FILES:
            if (hf_dir / name).exists():
                shutil.copy2(hf_dir / name, dest / "hf" / name)
        if spec.vision is not None or spec.composite:
            save_text_model(hf_dir, dest / "hf")
        for name in EAGLE_FILES if spec.eagle else ():
            shutil.copy2(out_dir / name, dest / name)
        if spec.lora:
            shutil.copy2(out_dir / "lora.mnn", dest / "lora.mnn")
            (dest / "hf" / "adapter").mkdir()
            for name in ADAPTER_FILES:
                shutil.copy2(Path(tmp) / "adapter" / name, dest / "hf" / "adapter" / name)
    reference = record_oracle_fresh(dest, PROMPTS) if spec.stateful else record_oracle(dest, PROMPTS)
    reference["export_args"] = spec.export_args
    reference["family"] = spec.family
    reference["tied"] = spec.tied
    reference["op_counts"], subgraph_counts = mnn_op_counts(dest)
    if subgraph_counts:
        reference["subgraph_op_counts"] = subgraph_counts
    (dest / "reference.json").write_text(to_readable_json(reference))
    # every step's and one prompt's every row's top logits, by a second run checked against this one
    # (imported here: that tool reads this module's layout)
    from tools.record_steps_top import add_records

    print(f"{spec.name}: {add_records(dest)}")
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description="Make the tiny real-export model fixtures.")
    parser.add_argument("names", nargs="*", help="fixture names (default: all)")
    args = parser.parse_args()
    disable_converter_telemetry()
    chosen = [spec for spec in SPECS if not args.names or spec.name in args.names]
    if any(spec.exporter == "head" for spec in chosen):
        head_export.head_build()   # before any fixture is made: exits saying how to get the build
    for spec in chosen:
        path = make_fixture(spec)
        print(f"{spec.name}: {folder_size(path) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
