"""The one table of config keys: one row per key MNN's LLM engine reads (plus mnngpu's own).

A row holds the key's default (MNN's, from llmconfig.hpp and llm.cpp), the check its value
must pass, its status, and whether only `load()` reads it. The status says what mnngpu does:

* ``implemented``: mnngpu does what MNN does with it.
* ``warned``: it changes only speed, memory or logging, and mnngpu does not act on it; a
  value other than MNN's default draws one ConfigWarning line naming where it came from. The
  keys that tune MNN's own runtime to a machine (`quiet_in_folder`: memory, power,
  dynamic_option) are silent when the model folder's files set them: a folder carries them
  from its export or its publisher, and the user chose nothing; set_config() or a flag warns.
* ``rejected``: a value outside `supported` changes what the model computes, and mnngpu does
  not compute it that way; LlmConfig raises ConfigError naming the key when it loads.
* ``inert``: MNN itself does nothing with it for a text model mnngpu runs (it serves a part
  that a rejected key already refuses, or MNN reads it and never uses it).

`docs/formats.md` holds the same table, rendered by `markdown_table()`; a test checks they agree.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IMPLEMENTED = "implemented"
WARNED = "warned"
REJECTED = "rejected"
INERT = "inert"
STATUSES = (IMPLEMENTED, WARNED, REJECTED, INERT)

LEVELS = ("low", "normal", "high")  # precision, power, memory
SAMPLER_TYPES = ("greedy", "temperature", "topK", "topP", "minP", "min_p", "tfs", "typical", "penalty",
                 "mixed")
SPECULATIVE_TYPES = ("", "lookahead", "mtp", "draftmodel", "eagle", "dflash")
ATTENTION_TYPES = ("full", "sliding", "mix")
TIE_FIELDS = ("weight_offset", "alpha_offset", "alpha_size", "quant_bit", "quant_block")

# What a value must be: the expectation in words (for the error) and the test.
Check = tuple[str, Callable[[Any], bool]]


class _NoDefault:
    def __repr__(self) -> str:
        return "NO_DEFAULT"


NO_DEFAULT = _NoDefault()  # a key MNN reads only when a file sets it


# ---- value checks: each returns True when the value is acceptable ----------------------------

def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _is_bool(value: Any) -> bool:
    return isinstance(value, bool)


def _is_str(value: Any) -> bool:
    return isinstance(value, str)


def _is_dict(value: Any) -> bool:
    return isinstance(value, dict)


def _is_int_list(value: Any) -> bool:
    return isinstance(value, list) and all(_is_int(item) for item in value)


def _at_least(low: int, words: str) -> Check:
    return words, lambda value: _is_int(value) and value >= low


def _one_of(choices: tuple[str, ...]) -> Check:
    return f"one of {list(choices)}", lambda value: isinstance(value, str) and value in choices


def _is_chunk_limits(value: Any) -> bool:
    return _is_int_list(value) and len(value) >= 2 and min(value) >= 1


def _is_sampler_list(value: Any) -> bool:
    return isinstance(value, list) and all(item in SAMPLER_TYPES and item != "mixed" for item in value)


def _is_logit_bias(value: Any) -> bool:
    def int_key(key: str) -> bool:
        return key.lstrip("-").isdigit()
    return isinstance(value, dict) and all(int_key(k) and _is_number(v) for k, v in value.items())


def _is_tie_embeddings(value: Any) -> bool:
    if isinstance(value, list):
        return len(value) >= 5 and _is_int_list(value)
    if isinstance(value, dict):
        return all(_is_int(value.get(name, 0)) for name in TIE_FIELDS)
    return False


def _quant_mode_int8(value: Any) -> bool:
    # attention_mode = flash * 8 + KV quant mode; flash attention changes only speed.
    return isinstance(value, int) and value % 8 in (0, 1, 2)


def _equals(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


POSITIVE = _at_least(1, "a positive integer")
NOT_NEGATIVE = _at_least(0, "an integer >= 0")
INTEGER: Check = ("an integer", _is_int)
NUMBER: Check = ("a number", _is_number)
STRING: Check = ("a string", _is_str)
OBJECT: Check = ("a JSON object", _is_dict)

# The check of a key without one of its own: the JSON type of MNN's default.
_BY_TYPE_OF_DEFAULT: dict[type, Check] = {
    bool: ("true or false", _is_bool),
    int: INTEGER,
    float: NUMBER,
    str: STRING,
    dict: OBJECT,
    list: ("a list of integers", _is_int_list),
}

# jinja's own keys (the object's fields, checked one by one)
JINJA_CHECKS: dict[str, Check] = {"chat_template": STRING, "bos": STRING, "eos": STRING, "context": OBJECT}


# ---- the row ----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Key:
    status: str
    note: str
    default: Any = NO_DEFAULT
    own_check: Check | None = None   # stricter than "the JSON type of the default"
    supported: Check | None = None   # a rejected key: the values mnngpu runs as MNN does
    at_load: bool = False            # only load() reads it: set after load(), it waits for the next one
    quiet_in_folder: bool = False    # warned: silent when a model folder's file sets it (see above)

    @property
    def check(self) -> Check | None:
        """What the value must be; None where nothing is known of it (no default, no check)."""
        if self.own_check is not None or self.default is NO_DEFAULT:
            return self.own_check
        return _BY_TYPE_OF_DEFAULT[type(self.default)]


def _done(note: str, default: Any = NO_DEFAULT, check: Check | None = None, at_load: bool = False) -> Key:
    return Key(IMPLEMENTED, note, default, check, at_load=at_load)


def _warned(note: str, default: Any = NO_DEFAULT, check: Check | None = None, at_load: bool = False,
            quiet_in_folder: bool = False) -> Key:
    return Key(WARNED, note, default, check, at_load=at_load, quiet_in_folder=quiet_in_folder)


def _inert(note: str, default: Any = NO_DEFAULT) -> Key:
    return Key(INERT, note, default)


def _rejected(note: str, supported: Check, default: Any = NO_DEFAULT, at_load: bool = False) -> Key:
    return Key(REJECTED, note, default, supported=supported, at_load=at_load)


def _each(row: Key, defaults: dict[str, Any]) -> dict[str, Key]:
    """Keys that share a status and note, each with its own default."""
    return {name: dataclasses.replace(row, default=default) for name, default in defaults.items()}


def _all(row: Key, names: tuple[str, ...]) -> dict[str, Key]:
    return {name: row for name in names}


_FILES = "a file name under base_dir"
_SAMPLER = "the sampler (mnngpu.sampler), as MNN's"
_MULTIMODAL = "vision, audio and speech models only: read by the parts mnngpu does not implement"
_SPLIT = "split (is_single false) and NPU exports only; is_single false is rejected"
_SPECULATIVE = "read by a speculative generation strategy only (speculative_type)"
_DFLASH = "dflash drafts only (speculative_type dflash)"
_NEVER_USED = "MNN reads it and never uses it"
_TEMPLATES = "MNN reads it and never uses it (templates are jinja)"
_PLE = "Gemma 4's per-layer embeddings (ple_embed_file)"

KEYS: dict[str, Key] = {
    # ---- files -------------------------------------------------------------------------------
    "base_dir": _done("the folder the other file names are taken from (config.json only)", check=STRING),
    "llm_config": _done(_FILES, "llm_config.json"),
    "llm_model": _done(_FILES, "llm.mnn", at_load=True),
    "llm_weight": _done(_FILES, "llm.mnn.weight", at_load=True),
    "tokenizer_file": _done(_FILES + "; load() fails without it", "tokenizer.txt", at_load=True),
    "embedding_file": _done(_FILES, "embeddings_bf16.bin", at_load=True),
    "context_file": _done(_FILES + "; merged into jinja.context at load", "context.json", at_load=True),
    "jinja": _done("chat_template, bos, eos and context for the chat template"),
    "block_model": _inert(_SPLIT, "block_"),
    "lm_model": _inert(_SPLIT, "lm.mnn"),
    "embedding_model": _inert(_SPLIT, "embedding.mnn"),
    "npu_model_dir": _inert(_SPLIT, ""),
    "matryoshka": _done("mnngpu's own: an embedding model trained for Matryoshka truncation (Qwen3-Embedding is); "
                        "POST /v1/embeddings then takes `dimensions`, else refuses it", False),
    # ---- generation --------------------------------------------------------------------------
    "max_new_tokens": _done("the reply length limit", 512, NOT_NEGATIVE),
    "max_all_tokens": _done("the context length limit", 2048, _at_least(1, "an integer >= 1")),
    "reuse_kv": _done("keep the KV cache between replies", False),
    "all_logits": _done("forward returns every position's logits", False),
    "use_template": _done("response() applies the chat template; set_config after load reaches it", True),
    "system_prompt": _done("the system turn of the chat template; set_config after load reaches it", ""),
    "chunk": _done("a longer prefill runs in pieces of this many ids", 0, NOT_NEGATIVE),
    "chunk_limits": _done("overrides chunk with its largest entry; the last piece is not padded up to an "
                          "entry (padding changes no logit on the backends mnngpu has)",
                          check=("a list of at least 2 positive integers, e.g. [128, 1]", _is_chunk_limits)),
    "prompt_cache": _warned("MNN's cross-turn prompt text cache (speed only)", False),
    "timeout_ms": _warned("no generation time limit", -1),
    "async": _warned("MNN's asynchronous decode (speed only)", True),
    "hidden_states": _done("the graph's hidden_states output is computed where the generation strategy reads it "
                           "(EAGLE, whatever this key says); forward() returns logits, as MNN's Python forward does",
                           False),
    "enable_debug": _warned("MNN's debug session mode", False),
    # ---- runtime -----------------------------------------------------------------------------
    "backend_type": _done("cpu, opencl, vulkan or cuda", "cpu", at_load=True),
    "strict_device": _done("mnngpu's own: an op the backend declines is a BackendUnavailableError, "
                           "not a CPU fallback", False),
    "int8_activations": _done("mnngpu's own: the CPU's int4 layers at precision low quantize their activations to "
                              "int8 (MNN's memory-low arithmetic: faster prefill and batched decode, logits further "
                              "from exact) instead of int16; other backends or precisions, or a model without "
                              "such layers: a ConfigError", False,
                              at_load=True),
    "thread_num": _done("CPU threads", 4, POSITIVE, at_load=True),
    "precision": _done("low and normal: fp16 where the backend has it; high: fp32", "low", _one_of(LEVELS),
                       at_load=True),
    "power": _warned("MNN's CPU core selection (speed only)", "normal", _one_of(LEVELS), at_load=True,
                     quiet_in_folder=True),
    "memory": _warned("MNN's weight and activation storage choice (memory and speed)", "low", _one_of(LEVELS),
                      at_load=True, quiet_in_folder=True),
    "dynamic_option": _warned("MNN's CPU activation quantization granularity; mnngpu's follows precision", 0,
                              quiet_in_folder=True),
    "use_mmap": _done("cpu: the weights packing converts (not views of the mapped llm.mnn.weight) go to files "
                      "under tmp_path; other backends: one warning (weights in device memory)", False, at_load=True),
    "use_cached_mmap": _warned("MNN's cache of rearranged weights on disk", True),
    "mmap_size": _warned("MNN's mmap file block size", 1024, POSITIVE),
    "kvcache_mmap": _done("cpu: the KV cache lives in files under tmp_path; other backends: one warning "
                          "(KV cache in device memory)", False, at_load=True),
    "tmp_path": _done("the folder kvcache_mmap and use_mmap write to; never inside the model folder", "",
                      at_load=True),
    "prefix_cache_path": _done("when set, a prompt start's KV cache is stored there and reloaded by a later "
                               "prompt with the same start (cpu, opencl, vulkan; cuda: a ConfigError)",
                               "prefixcache", at_load=True),
    "cache_ram": _done("mnngpu's own: MiB of host memory for the server's prompt cache, the KV blocks of "
                       "earlier prompts' starts that every request and slot reuses (cpu, opencl, vulkan); 0: off "
                       "(serve --cache-ram)", 0, NOT_NEGATIVE),
    "attention_mode": _rejected("KV quantization modes 3-6 (TQ3, TQ4) are not implemented; modes 1 and 2 "
                                "(int8 keys; int8 keys and values) run on cpu, opencl and vulkan, on cuda they are a "
                                "ConfigError; flash attention (attention_mode / 8) changes only speed",
                                ("attention_mode % 8 in 0, 1, 2", _quant_mode_int8), 8, at_load=True),
    "quant_qkv": _rejected("the deprecated spelling of attention_mode, read when attention_mode is unset",
                           ("quant_qkv % 8 in 0, 1, 2", _quant_mode_int8), 8, at_load=True),
    "cpu_sme2_neon_division_ratio": _warned("Arm SME work split (speed only)", 41),
    "cpu_sme_core_num": _warned("Arm SME cores (speed only)", 2),
    # ---- the model's facts -------------------------------------------------------------------
    "model_type": _done("shown by inspect; the graph, not the name, decides what runs", ""),
    "hidden_size": _done("checked against the graph and the embedding", 4096, POSITIVE, at_load=True),
    "layer_nums": _done("checked against the graph's Attention ops", 32, POSITIVE, at_load=True),
    "tie_embeddings": _done("embedding rows quantized or shared with the lm_head",
                            check=(f"a list of at least 5 integers {list(TIE_FIELDS)} or an object with those "
                                   "integer fields", _is_tie_embeddings), at_load=True),
    "attention_mask": _rejected("the glm and glm2 masks and positions are not implemented",
                                ('"float" or "int" (causal)', _equals("float", "int")), "int"),
    "attention_type": _done("full; mix: the layers the export marks sliding see only the last sliding_window keys "
                            "(cpu, opencl, vulkan; cuda: a ConfigError); sliding: causal without a window, as "
                            "MNN's runtime masks it (one note line)", "full", _one_of(ATTENTION_TYPES)),
    "sliding_window": _done("the key window of a mix export's sliding layers; with sliding, not applied (as MNN)",
                            0, NOT_NEGATIVE),
    "is_mrope": _done("an mrope graph (position_ids [3, seq]) gets MNN's time/height/width positions; "
                      "the graph's position_ids input decides, as in MNN", False),
    "mrope_axes": _rejected("mrope graphs with other than 3 position axes are not implemented",
                            ("3", _equals(3)), 3),
    "attn_scale": _done("the attention scale where the Attention op records none", 0.0, at_load=True),
    "attention_fused": _inert(_NEVER_USED, True),
    "key_value_shape": _inert(_NEVER_USED, []),
    "max_position_embeddings": _inert("MNN only logs a line when a sequence passes it", 0),
    "is_single": _rejected("split block exports are not implemented", ("true", _equals(True)), True),
    "is_visual": _done("the model is an Omni: <img>PATH</img> in a prompt runs visual.mnn (Qwen2-VL's "
                       "inputs) and puts its rows at the image_pad ids", False),
    "is_audio": _done("the model is an Omni: <audio>PATH</audio> in a prompt runs audio.mnn (Qwen2-Audio's "
                      "input_features) and puts its rows at the audio_pad ids", False),
    "has_talker": _warned("speech output is not supported; the text, vision and audio parts load and run", False),
    "has_deepstack": _done("Qwen3-VL: the LLM graph's deepstack_embeds input gets the vision graph's deepstack "
                           "features at an image's rows, zeros elsewhere", False),
    "ple_embed_file": _done("Gemma 4: a file under base_dir of bf16 rows [vocab][ple_embed_dim], each token's rows "
                            "fed (times ple_embed_scale) to the graph's ple_embeddings input at every forward",
                            check=STRING, at_load=True),
    "ple_embed_scale": _done(_PLE + ": the factor its rows are multiplied by", 1.0, at_load=True),
    "ple_embed_dim": _done(_PLE + ": the width of its rows (every layer's rows side by side)", 0, NOT_NEGATIVE,
                           at_load=True),
    "ple_quant": _rejected("quantized per-layer embeddings (llmexport --embed_bit 4 or 8) are not implemented; "
                           "export with the default --embed_bit 16", ("unset", _equals(None))),
    "load_disk_embedding_only": _inert(_MULTIMODAL),
    "is_embedding": _rejected("an Omni that gives sentence embeddings (MNN after 3.6.1) is not implemented",
                              ("false", _equals(False)), False),
    "mllm": _done("the vision module's runtime (backend_type, thread_num, precision, power, memory); "
                  "absent: the LLM's, as MNN's", check=OBJECT),
    "bos": _inert("MNN's templates take bos from jinja.bos or the tokenizer", ""),
    "chat_template": _inert("MNN's templates take it from jinja.chat_template or the tokenizer", ""),
    **_each(_inert(_TEMPLATES), {
        "prompt_template": "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n",
        "system_prompt_template": "<|im_start|>system\n%s<|im_end|>\n",
        "user_prompt_template": "<|im_start|>user\n%s<|im_end|>\n",
        "assistant_prompt_template": "<|im_start|>assistant\n%s<|im_end|>\n"}),
    # ---- sampler -----------------------------------------------------------------------------
    "sampler_type": _done(_SAMPLER, "mixed", _one_of(SAMPLER_TYPES)),
    "mixed_samplers": _done(_SAMPLER, ["topK", "tfs", "typical", "topP", "min_p", "temperature"],
                            (f"a list of sampler names from {[s for s in SAMPLER_TYPES if s != 'mixed']}",
                             _is_sampler_list)),
    **_each(_done(_SAMPLER), {"temperature": 1.0, "top_k": 40, "top_p": 0.9, "min_p": 0.1, "tfs_z": 1.0,
                              "typical": 1.0, "repetition_penalty": 1.0, "presence_penalty": 0.0,
                              "frequency_penalty": 0.0}),
    "penalty_window": _done(_SAMPLER, 0, NOT_NEGATIVE),
    "n_gram": _done(_SAMPLER, 8, POSITIVE),
    "ngram_factor": _done(_SAMPLER, 1.0),
    "penalty_sampler": _done(_SAMPLER, "greedy"),
    "logit_bias": _done(_SAMPLER, {}, ('an object of token id -> number, e.g. {"42": -1.5}', _is_logit_bias)),
    "banned_tokens": _done(_SAMPLER, []),
    **{name: _done("an older spelling the sampler falls back to, as MNN's", check=check) for name, check in (
        ("topK", INTEGER), ("topP", NUMBER), ("minP", NUMBER), ("tfsZ", NUMBER), ("penalty", NUMBER))},
    "seed": _done("mnngpu's own: the sampler's random seed (MNN's sampler has none)",
                  check=_at_least(0, "an integer >= 0")),
    # ---- speculative decoding ----------------------------------------------------------------
    "speculative_type": _done("the generation strategy (mnngpu/generation): lookahead and eagle run, with AR's "
                              "tokens; mtp and dflash are a ConfigError at load saying what is missing", "",
                              _one_of(SPECULATIVE_TYPES)),
    "draft_predict_length": _done("lookahead's settings, as MNN's", 3, POSITIVE),
    "draft_match_strictness": _done("lookahead's settings, as MNN's", "low", _one_of(("low", "medium", "high"))),
    "draft_selection_rule": _done("lookahead's settings, as MNN's", "freqxlen", _one_of(("freqxlen", "fcfs"))),
    "ngram_match_maxlen": _done("lookahead's settings, as MNN's", 4, POSITIVE),
    **_each(_done("lookahead's settings, as MNN's"), {"ngram_update": False, "lookup_file": "lookup_file.txt"}),
    **_each(_done("EAGLE's draft files and chain depth, as MNN's"), {
        "eagle_model": "eagle.mnn", "eagle_fc": "eagle_fc.mnn", "eagle_d2t": "eagle_d2t.mnn"}),
    "eagle_depth": _done("EAGLE's draft files and chain depth, as MNN's", 3, POSITIVE),
    "eagle_topk": _done("1 (MNN's default) runs; above 1 a ConfigError at load with speculative_type eagle: "
                        "a token tree's verify needs a tree attention mask, which mnngpu's Attention ops do not take",
                        1, POSITIVE),
    **_each(_inert(_SPECULATIVE + "; mtp is refused at load"), {"draft_model": "", "mtp_model": "mtp.mnn"}),
    **_all(_inert(_DFLASH), (
        "dflash_model", "dflash_fc", "dflash_kvmat", "dflash_block_size", "dflash_mask_token_id",
        "dflash_shift_label", "dflash_target_layer_ids", "dflash_shared_lmhead_input")),
    # ---- vision, audio and speech ------------------------------------------------------------
    **_all(_done("Qwen2-VL image input, as MNN 3.6.1's Omni (mnngpu/omni/vision.py)"), (
        "visual_model", "vision_start", "vision_end", "image_pad", "image_size", "image_mean", "image_norm")),
    "num_grid_per_side": _done("Qwen3-VL: the side of the vision graph's learned position table, stretched over "
                               "the patch grid (mnngpu/omni/vision.py)"),
    **_all(_done("Qwen2-Audio input, as MNN 3.6.1's Omni (mnngpu/omni/audio.py)"), (
        "audio_model", "audio_pad", "audio_start", "audio_end")),
    "asr_language": _done("a variable of the chat template beside jinja.context, as MNN after 3.6.1 passes it",
                          check=STRING),
    "talker_type": _rejected("qwen3_tts (MNN after 3.6.1: a text-to-speech model, no chat LLM) is not implemented",
                             ("not qwen3_tts", lambda value: value != "qwen3_tts")),
    "audio_type": _rejected("only whisper log-mel features are implemented (conformer and usm are not)",
                            ("whisper", _equals(None, "whisper"))),
    **_all(_inert(_MULTIMODAL), (
        "n_window",
        "asr_use_audio_template", "vision_type",
        "video_pad", "image_size_unit", "image_max_size",
        "image_min_pixels", "image_max_pixels", "global_image", "patch_size",
        "scale_emb", "video_fps", "video_max_frames", "video_max_pixels", "video_max_vision_tokens",
        "vision_slice_start_id", "vision_slice_end_id", "vision_id_start_id", "vision_id_end_id",
        "hunyuan_patch_size", "hunyuan_spatial_merge_size", "hunyuan_temporal_patch_size",
        "sliding_attn_layers", "talker_model", "talker_weight", "talker_embedding_file",
        "talker_text_embedding_file", "talker_text_hidden_size", "talker_max_new_tokens",
        "talker_speaker", "tts_bos_token_id", "tts_eos_token_id", "tts_pad_token_id", "code_predictor_model",
        "code_predictor_weight", "code_predictor_embedding_file", "code_predictor_vocab_size",
        "code_predictor_groups", "speech_decoder_model", "speech_decoder_weight",
        "speech_decoder_upsample_rate", "speaker_encoder_model", "speaker_encoder_weight",
        "speaker_encoder_sample_rate", "prompt_embedder_model", "prompt_embedder_weight",
        "codec_embedder_model", "codec_embedder_weight", "predit_model", "dit_model", "bigvgan_model",
        "spk_dict", "interleaved", "dit_steps", "dit_solver")),
}

# Read from the rows: MNN's default of every key that has one, every key MNN reads, and the keys
# only load() reads.
DEFAULTS: dict[str, Any] = {name: key.default for name, key in KEYS.items() if key.default is not NO_DEFAULT}
KNOWN_KEYS: frozenset[str] = frozenset(KEYS)
LOAD_TIME_KEYS: frozenset[str] = frozenset(name for name, key in KEYS.items() if key.at_load)


def _shown_note(key: Key) -> str:
    if key.status == REJECTED:
        return f"supported: {key.supported[0]}; otherwise rejected: {key.note}"
    return key.note


def markdown_table() -> str:
    """The table as docs/formats.md shows it: keys in the order above, neighbours that share a
    status and note in one row."""
    rows: list[tuple[list[str], str, str]] = []
    for name, key in KEYS.items():
        note = _shown_note(key)
        if rows and rows[-1][1:] == (key.status, note):
            rows[-1][0].append(name)
        else:
            rows.append(([name], key.status, note))
    lines = ["| key | status | what mnngpu does |", "| --- | --- | --- |"]
    for names, status, note in rows:
        keys = ", ".join(f"`{name}`" for name in names)
        lines.append(f"| {keys} | {status} | {note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
