"""The model families mnngpu supports, by llm_config.json's `model_type`.

A family is supported when its exports agree with MNN's own runtime on every backend (the
fixture models under tests/fixtures/models). The graph, not the name, decides what runs:
`mnngpu inspect` reports both, so an unlisted family whose ops are all supported is shown as
such, and a listed family whose export brings an op no backend runs is shown as not runnable.
"""

from __future__ import annotations

from typing import Any

SUPPORTED = {
    "qwen2": "Qwen2 / Qwen2.5",
    "qwen3": "Qwen3 (dense)",
    "llama": "Llama 2 / 3.x (the exporter drops llama3 rope scaling, as MNN does)",
    # the exporter writes these with attention_type "full" and no sliding_window, and keeps
    # gemma2's final-logit soft-capping (not its attention soft-capping) in the graph: mnngpu runs
    # what the export says, as MNN does
    "mistral": "Mistral (exported with full attention)",
    "gemma2": "Gemma 2 (exported with full attention and final-logit soft-capping)",
    "phi3": "Phi-3 / Phi-3.5 / Phi-4-mini",
    "phi": "Phi-2 (partial rotary, parallel attention and MLP)",
    "hunyuan_v1_dense": "Hunyuan dense (query and key norms)",
    # MNN's MoE op with one subgraph per expert: inlined at load, routing on the device
    "qwen3_moe": "Qwen3 MoE (Qwen3-30B-A3B style: routed experts, no shared expert)",
    # the exporter writes mix when the layers mix sliding and full attention, sliding when every
    # layer slides (MNN's runtime then applies no window, and neither does mnngpu)
    "gemma3_text": "Gemma 3 text (sliding-window attention: attention_type mix or sliding)",
    "qwen2_vl": "Qwen2-VL (text and image input: visual.mnn, as MNN's Omni)",
    "qwen2_5_vl": "Qwen2.5-VL (text and image input: visual.mnn with its windows, as MNN's Omni)",
    "qwen3_vl": "Qwen3-VL (text and image input: visual.mnn with its position table and deepstack rows, "
                "as MNN's Omni)",
    "qwen2_audio": "Qwen2-Audio (text and audio input: audio.mnn on whisper log-mel features, as MNN's Omni)",
    # LinearAttention (short_conv): its state on the device on opencl and vulkan; cuda declines it
    "lfm2": "LFM2 (short-convolution layers with a recurrent state, and attention layers; on cuda the "
            "convolutions run on the CPU backup)",
    # LinearAttention (gated_delta_rule) likewise; visual.mnn is Qwen3-VL's tower without deepstack
    "qwen3_5": "Qwen3.5 (Gated DeltaNet layers with a recurrent state, and full-attention layers; text "
               "and images (a Qwen3-VL-style tower without deepstack); on cuda the DeltaNet layers run on "
               "the CPU backup)",
    "qwen3_5_moe": "Qwen3.5 MoE (as Qwen3.5, with routed experts and a gated shared expert)",
    # MNN's newer exporter names a text-only Qwen3.5 (no vision tower in its config) by its text config
    "qwen3_5_text": "Qwen3.5 text only (as Qwen3.5, without the vision tower)",
    # the ple_embeddings input gets ple_embed_file's rows; the exporter rotates the full layers' partial
    # rotary as the first rotary_dim dims, where HF's proportional rotary pairs dims half a head apart
    # the exporter writes every layer as full attention with rotary (attention_type full): mnngpu runs
    # the export as MNN does, which departs from HF's model where those parts act
    "llama4_text": ("Llama 4 text (dense); the exporter dropped chunked attention, attention temperature "
                    "tuning and the no-rope layers: every layer runs as full attention with rotary, as in MNN"),
    "gemma4": ("Gemma 4 text (per-layer embeddings, sliding and full layers with their own rotary; "
               "exported with one head width, and with the full layers' partial rotary laid out unlike HF's)"),
}

# families MNN's exporter writes that are known not to run yet, and why
NOT_SUPPORTED = {
    # mnngpu runs such an export exactly as MNN does; it is the export that is wrong
    "glm": ("MNN's exporter maps GLM-4 with its generic decoder, which rotates the partial rotary "
            "half-split instead of interleaved: the export is 2-4 logit std away from the source model"),
    "gpt_oss": ("MNN's exporter 0.0.5 cannot export it with transformers 5: AttributeError: 'GptOssExperts' "
                "object has no attribute 'act_fn' (llmexport/utils/transformers.py, Mlp.__init__)"),
    "lfm2_moe": ("MNN's exporter 0.0.5 cannot export it with transformers 5: TypeError: topk(): argument 'k' "
                 "must be int, not NoneType (its mapper reads the MoE block's top_k, which transformers 5 "
                 "moved to the router)"),
}


def family_facts(model_type: str | None) -> dict[str, Any]:
    """{"model_type", "supported", "note"}: whether mnngpu supports the family, in one line."""
    listed = ", ".join(sorted(SUPPORTED))
    if not model_type:
        note = f"llm_config.json names no model_type (supported families: {listed})"
        return {"model_type": model_type or None, "supported": False, "note": note}
    if model_type in SUPPORTED:
        return {"model_type": model_type, "supported": True, "note": SUPPORTED[model_type]}
    reason = NOT_SUPPORTED.get(model_type, "not a family mnngpu supports")
    return {"model_type": model_type, "supported": False, "note": f"{reason} (supported families: {listed})"}
