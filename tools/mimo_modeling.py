"""A MiMo-shaped model for `trust_remote_code`: Qwen2 with one multi-token-prediction layer.

transformers has no `mimo` architecture; MNN's exporter writes mtp.mnn only for `model_type`
mimo (and poi_qwen2_mtp) and loads the model with trust_remote_code. make_fixtures.py copies
this file into the HuggingFace folder as modeling_mimo.py. The MTP layer's parts have the names
llmexport reads from `model.mtp_layers[0]`; the HF forward is Qwen2's and never runs it.
"""

from __future__ import annotations

from torch import nn
from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Model
from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2MLP, Qwen2RMSNorm


class MiMoConfig(Qwen2Config):
    model_type = "mimo"

    def __init__(self, num_nextn_predict_layers: int = 1, **kwargs):
        self.num_nextn_predict_layers = num_nextn_predict_layers
        super().__init__(**kwargs)


class MiMoMTPLayer(nn.Module):
    """Reads the last layer's output at position i with the embedding of token i+1, and predicts
    token i+2 through the base model's final norm and lm_head."""

    def __init__(self, config: MiMoConfig, layer_idx: int):
        super().__init__()
        hidden, eps = config.hidden_size, config.rms_norm_eps
        self.token_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.hidden_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.input_proj = nn.Linear(2 * hidden, hidden, bias=False)
        self.input_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.self_attn = Qwen2Attention(config, layer_idx)
        self.post_attention_layernorm = Qwen2RMSNorm(hidden, eps=eps)
        self.mlp = Qwen2MLP(config)
        self.final_layernorm = Qwen2RMSNorm(hidden, eps=eps)


class MiMoModel(Qwen2Model):
    config_class = MiMoConfig

    def __init__(self, config: MiMoConfig):
        super().__init__(config)
        self.mtp_layers = nn.ModuleList(
            MiMoMTPLayer(config, config.num_hidden_layers - 1) for _ in range(config.num_nextn_predict_layers))


class MiMoForCausalLM(Qwen2ForCausalLM):
    config_class = MiMoConfig

    def __init__(self, config: MiMoConfig):
        super().__init__(config)
        self.model = MiMoModel(config)
        self.post_init()
