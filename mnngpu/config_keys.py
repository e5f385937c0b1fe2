"""The one table of every config key MNN's LLM engine reads, and what mnngpu does with each.

Each key has a status:

* ``implemented``: mnngpu does what MNN does with it.
* ``warned``: it changes only speed, memory or logging, and mnngpu does not act on it; a
  value other than MNN's default draws one ConfigWarning line.
* ``rejected``: a value outside `supported` changes what the model computes, and mnngpu does
  not compute it that way; LlmConfig raises ConfigError naming the key when it loads.
* ``inert``: MNN itself does nothing with it for a text model mnngpu runs (it serves a part
  that a rejected key already refuses, or MNN reads it and never uses it).

`docs/formats.md` holds the same table, rendered by `markdown_table()`; a test checks they agree.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

IMPLEMENTED = "implemented"
WARNED = "warned"
REJECTED = "rejected"
INERT = "inert"
STATUSES = (IMPLEMENTED, WARNED, REJECTED, INERT)


@dataclass(frozen=True)
class Key:
    status: str
    note: str
    # For a rejected key: the values mnngpu runs as MNN does, and those values in words.
    supported: Callable[[Any], bool] | None = None
    supported_text: str = ""


def _equals(*values: Any) -> Callable[[Any], bool]:
    return lambda value: value in values


def _quant_mode_int8(value: Any) -> bool:
    # attention_mode = flash * 8 + KV quant mode; flash attention changes only speed.
    return isinstance(value, int) and value % 8 in (0, 1, 2)


def _done(note: str) -> Key:
    return Key(IMPLEMENTED, note)


def _warned(note: str) -> Key:
    return Key(WARNED, note)


def _inert(note: str) -> Key:
    return Key(INERT, note)


def _rejected(note: str, supported: Callable[[Any], bool], supported_text: str) -> Key:
    return Key(REJECTED, note, supported, supported_text)


_FILES = "a file name under base_dir"
_SAMPLER = "the sampler (mnngpu.sampler), as MNN's"
_MULTIMODAL = "vision, audio and speech models only: read by the parts mnngpu does not implement"
_SPLIT = "split (is_single false) and NPU exports only; is_single false is rejected"
_SPECULATIVE = "read by a speculative generation strategy only (speculative_type)"
_DFLASH = "dflash drafts only (speculative_type dflash)"

KEYS: dict[str, Key] = {
    # ---- files -------------------------------------------------------------------------------
    "base_dir": _done("the folder the other file names are taken from (config.json only)"),
    "llm_config": _done(_FILES),
    "llm_model": _done(_FILES),
    "llm_weight": _done(_FILES),
    "tokenizer_file": _done(_FILES + "; load() fails without it"),
    "embedding_file": _done(_FILES),
    "context_file": _done(_FILES + "; merged into jinja.context at load"),
    "jinja": _done("chat_template, bos, eos and context for the chat template"),
    "block_model": _inert(_SPLIT),
    "lm_model": _inert(_SPLIT),
    "embedding_model": _inert(_SPLIT),
    "npu_model_dir": _inert(_SPLIT),
    # ---- generation --------------------------------------------------------------------------
    "max_new_tokens": _done("the reply length limit"),
    "max_all_tokens": _done("the context length limit"),
    "reuse_kv": _done("keep the KV cache between replies"),
    "all_logits": _done("forward returns every position's logits"),
    "use_template": _done("response() applies the chat template; set_config after load reaches it"),
    "system_prompt": _done("the system turn of the chat template; set_config after load reaches it"),
    "chunk": _done("a longer prefill runs in pieces of this many ids"),
    "chunk_limits": _done("overrides chunk with its largest entry; the last piece is not padded up to an "
                          "entry (padding changes no logit on the backends mnngpu has)"),
    "prompt_cache": _warned("MNN's cross-turn prompt text cache (speed only)"),
    "timeout_ms": _warned("no generation time limit"),
    "async": _warned("MNN's asynchronous decode (speed only)"),
    "hidden_states": _done("the graph's hidden_states output is computed where the generation strategy reads it "
                           "(EAGLE, whatever this key says); forward() returns logits, as MNN's Python forward does"),
    "enable_debug": _warned("MNN's debug session mode"),
    # ---- runtime -----------------------------------------------------------------------------
    "backend_type": _done("cpu, opencl, vulkan or cuda"),
    "strict_device": _done("mnngpu's own: an op the backend declines is a BackendUnavailableError, "
                           "not a CPU fallback"),
    "thread_num": _done("CPU threads"),
    "precision": _done("low and normal: fp16 where the backend has it; high: fp32"),
    "power": _warned("MNN's CPU core selection (speed only)"),
    "memory": _warned("MNN's weight and activation storage choice (memory and speed)"),
    "dynamic_option": _warned("MNN's CPU activation quantization granularity; mnngpu's follows precision"),
    "use_mmap": _done("cpu: the weights packing converts (not views of the mapped llm.mnn.weight) go to files "
                      "under tmp_path; other backends: one warning (weights in device memory)"),
    "use_cached_mmap": _warned("MNN's cache of rearranged weights on disk"),
    "mmap_size": _warned("MNN's mmap file block size"),
    "kvcache_mmap": _done("cpu: the KV cache lives in files under tmp_path; other backends: one warning "
                          "(KV cache in device memory)"),
    "tmp_path": _done("the folder kvcache_mmap and use_mmap write to; never inside the model folder"),
    "prefix_cache_path": _done("when set, a prompt start's KV cache is stored there and reloaded by a later "
                               "prompt with the same start (cpu, opencl, vulkan; cuda: a ConfigError)"),
    "attention_mode": _rejected("KV quantization modes 3-6 (TQ3, TQ4) are not implemented; modes 1 and 2 "
                                "(int8 keys; int8 keys and values) run on cpu, opencl and vulkan, on cuda they are a "
                                "ConfigError; flash attention (attention_mode / 8) changes only speed",
                                _quant_mode_int8, "attention_mode % 8 in 0, 1, 2"),
    "quant_qkv": _rejected("the deprecated spelling of attention_mode, read when attention_mode is unset",
                           _quant_mode_int8, "quant_qkv % 8 in 0, 1, 2"),
    "cpu_sme2_neon_division_ratio": _warned("Arm SME work split (speed only)"),
    "cpu_sme_core_num": _warned("Arm SME cores (speed only)"),
    # ---- the model's facts -------------------------------------------------------------------
    "model_type": _done("shown by inspect; the graph, not the name, decides what runs"),
    "hidden_size": _done("checked against the graph and the embedding"),
    "layer_nums": _done("checked against the graph's Attention ops"),
    "tie_embeddings": _done("embedding rows quantized or shared with the lm_head"),
    "attention_mask": _rejected("the glm and glm2 masks and positions are not implemented",
                                _equals("float", "int"), '"float" or "int" (causal)'),
    "attention_type": _done("full; mix: the layers the export marks sliding see only the last sliding_window keys "
                            "(cpu, opencl, vulkan; cuda: a ConfigError); sliding: causal without a window, as "
                            "MNN's runtime masks it (one warning line)"),
    "sliding_window": _done("the key window of a mix export's sliding layers; with sliding, not applied (as MNN)"),
    "is_mrope": _done("an mrope graph (position_ids [3, seq]) gets MNN's time/height/width positions; "
                      "the graph's position_ids input decides, as in MNN"),
    "mrope_axes": _rejected("mrope graphs with other than 3 position axes are not implemented", _equals(3), "3"),
    "attn_scale": _done("the attention scale where the Attention op records none"),
    "attention_fused": _inert("MNN reads it and never uses it"),
    "key_value_shape": _inert("MNN reads it and never uses it"),
    "max_position_embeddings": _inert("MNN only logs a line when a sequence passes it"),
    "is_single": _rejected("split block exports are not implemented", _equals(True), "true"),
    "is_visual": _done("the model is an Omni: <img>PATH</img> in a prompt runs visual.mnn (Qwen2-VL's "
                       "inputs) and puts its rows at the image_pad ids"),
    "is_audio": _done("the model is an Omni: <audio>PATH</audio> in a prompt runs audio.mnn (Qwen2-Audio's "
                      "input_features) and puts its rows at the audio_pad ids"),
    "has_talker": _warned("speech output is not supported; the text, vision and audio parts load and run"),
    "has_deepstack": _done("Qwen3-VL: the LLM graph's deepstack_embeds input gets the vision graph's deepstack "
                           "features at an image's rows, zeros elsewhere"),
    "ple_embed_file": _rejected("per-layer embeddings are not implemented", _equals(None), "unset"),
    "ple_embed_scale": _inert("used only with ple_embed_file, which is rejected"),
    "ple_embed_dim": _inert("used only with ple_embed_file, which is rejected"),
    "ple_quant": _inert("used only with ple_embed_file, which is rejected"),
    "load_disk_embedding_only": _inert(_MULTIMODAL),
    "is_embedding": _inert(_MULTIMODAL),
    "mllm": _done("the vision module's runtime (backend_type, thread_num, precision, power, memory); "
                  "absent: the LLM's, as MNN's"),
    "bos": _inert("MNN's templates take bos from jinja.bos or the tokenizer"),
    "chat_template": _inert("MNN's templates take it from jinja.chat_template or the tokenizer"),
    "prompt_template": _inert("MNN reads it and never uses it (templates are jinja)"),
    "system_prompt_template": _inert("MNN reads it and never uses it (templates are jinja)"),
    "user_prompt_template": _inert("MNN reads it and never uses it (templates are jinja)"),
    "assistant_prompt_template": _inert("MNN reads it and never uses it (templates are jinja)"),
    # ---- sampler -----------------------------------------------------------------------------
    **{key: _done(_SAMPLER) for key in (
        "sampler_type", "mixed_samplers", "temperature", "top_k", "top_p", "min_p", "tfs_z", "typical",
        "repetition_penalty", "presence_penalty", "frequency_penalty", "penalty_window", "n_gram",
        "ngram_factor", "penalty_sampler", "logit_bias", "banned_tokens")},
    **{key: _done("an older spelling the sampler falls back to, as MNN's")
       for key in ("topK", "topP", "minP", "tfsZ", "penalty")},
    # ---- speculative decoding ----------------------------------------------------------------
    "speculative_type": _done("the generation strategy (mnngpu/generation): lookahead and eagle run, with AR's "
                              "tokens; mtp and dflash are a ConfigError at load saying what is missing"),
    **{key: _done("lookahead's settings, as MNN's") for key in (
        "draft_predict_length", "draft_match_strictness", "draft_selection_rule", "ngram_match_maxlen",
        "ngram_update", "lookup_file")},
    **{key: _done("EAGLE's draft files and chain depth, as MNN's") for key in (
        "eagle_model", "eagle_fc", "eagle_d2t", "eagle_depth")},
    "eagle_topk": _done("1 (MNN's default) runs; above 1 a ConfigError at load with speculative_type eagle: "
                        "a token tree's verify needs a tree attention mask, which mnngpu's Attention ops do not take"),
    **{key: _inert(_SPECULATIVE + "; mtp is refused at load") for key in ("draft_model", "mtp_model")},
    **{key: _inert(_DFLASH) for key in (
        "dflash_model", "dflash_fc", "dflash_kvmat", "dflash_block_size", "dflash_mask_token_id",
        "dflash_shift_label", "dflash_target_layer_ids", "dflash_shared_lmhead_input")},
    # ---- vision, audio and speech ------------------------------------------------------------
    **{key: _done("Qwen2-VL image input, as MNN 3.6.1's Omni (mnngpu/vision.py)") for key in (
        "visual_model", "vision_start", "vision_end", "image_pad", "image_size", "image_mean", "image_norm")},
    "num_grid_per_side": _done("Qwen3-VL: the side of the vision graph's learned position table, stretched over "
                               "the patch grid (mnngpu/vision.py)"),
    **{key: _done("Qwen2-Audio input, as MNN 3.6.1's Omni (mnngpu/audio.py)") for key in (
        "audio_model", "audio_pad", "audio_start", "audio_end")},
    "audio_type": _rejected("only whisper log-mel features are implemented (conformer and usm are not)",
                            _equals(None, "whisper"), "whisper"),
    **{key: _inert(_MULTIMODAL) for key in (
        "n_window",
        "asr_language", "asr_use_audio_template", "vision_type",
        "video_pad", "image_size_unit", "image_max_size",
        "image_min_pixels", "image_max_pixels", "global_image", "patch_size",
        "scale_emb", "video_fps", "video_max_frames", "video_max_pixels", "video_max_vision_tokens",
        "vision_slice_start_id", "vision_slice_end_id", "vision_id_start_id", "vision_id_end_id",
        "hunyuan_patch_size", "hunyuan_spatial_merge_size", "hunyuan_temporal_patch_size",
        "sliding_attn_layers", "talker_model", "talker_weight", "talker_embedding_file",
        "talker_text_embedding_file", "talker_text_hidden_size", "talker_type", "talker_max_new_tokens",
        "talker_speaker", "tts_bos_token_id", "tts_eos_token_id", "tts_pad_token_id", "code_predictor_model",
        "code_predictor_weight", "code_predictor_embedding_file", "code_predictor_vocab_size",
        "code_predictor_groups", "speech_decoder_model", "speech_decoder_weight",
        "speech_decoder_upsample_rate", "speaker_encoder_model", "speaker_encoder_weight",
        "speaker_encoder_sample_rate", "prompt_embedder_model", "prompt_embedder_weight",
        "codec_embedder_model", "codec_embedder_weight", "predit_model", "dit_model", "bigvgan_model",
        "spk_dict", "interleaved", "dit_steps", "dit_solver")},
}


def markdown_table() -> str:
    """The table as docs/formats.md shows it: keys in the order above, neighbours that share a
    status and note in one row."""
    rows: list[tuple[list[str], Key]] = []
    for name, key in KEYS.items():
        if rows and rows[-1][1] == key:
            rows[-1][0].append(name)
        else:
            rows.append(([name], key))
    lines = ["| key | status | what mnngpu does |", "| --- | --- | --- |"]
    for names, key in rows:
        note = key.note
        if key.status == REJECTED:
            note = f"supported: {key.supported_text}; otherwise rejected: {note}"
        keys = ", ".join(f"`{name}`" for name in names)
        lines.append(f"| {keys} | {key.status} | {note.replace('|', '/')} |")
    return "\n".join(lines) + "\n"
