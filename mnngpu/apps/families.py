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
}

# families MNN's exporter writes that are known not to run yet, and why
NOT_SUPPORTED = {
    # mnngpu runs such an export exactly as MNN does; it is the export that is wrong
    "glm": ("MNN's exporter maps GLM-4 with its generic decoder, which rotates the partial rotary "
            "half-split instead of interleaved: the export is 2-4 logit std away from the source model"),
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
