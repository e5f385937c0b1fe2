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
    "llama": "Llama 2 / 3.x",
    # the exporter writes these with attention_type "full" and no sliding_window, and keeps
    # gemma2's final-logit soft-capping (not its attention soft-capping) in the graph: mnngpu runs
    # what the export says, as MNN does
    "mistral": "Mistral (exported with full attention)",
    "gemma2": "Gemma 2 (exported with full attention and final-logit soft-capping)",
    "qwen2_vl": "Qwen2-VL (text and image input: visual.mnn, as MNN's Omni)",
    "qwen2_5_vl": "Qwen2.5-VL (text and image input: visual.mnn with its windows, as MNN's Omni)",
}

# families MNN's exporter writes that are known not to run yet, and why
NOT_SUPPORTED = {
    "qwen3_moe": "MNN's MoE op (expert subgraphs), TopKV2, Softmax and Reduction are not implemented",
    "gemma3_text": "sliding-window attention (attention_type sliding or mix) is not implemented",
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
