"""The generation strategy named by `speculative_type` (MNN's GenerationStrategyFactory).

"" is autoregressive decoding; "lookahead" runs on every model. "eagle", "mtp" and "dflash"
need the draft modules MNN's exporter writes next to llm.mnn: a folder without them gets a
one-line reason at load. EAGLE runs with eagle_topk 1; mnngpu does not run mtp and dflash drafts
yet, so a folder with them gets a ConfigError too. "draftmodel" appears in MNN's config notes
only; its engine has no such strategy. On a model with recurrent state (LinearAttention) every
strategy runs too: a partly rejected verify block rolls the state back (backend.kv.state_step).
"""

from __future__ import annotations

from pathlib import Path

from mnngpu.config import LlmConfig
from mnngpu.errors import ConfigError
from mnngpu.generation.ar import ArGeneration
from mnngpu.generation.eagle import EagleGeneration
from mnngpu.generation.eagle_draft import EagleDraft
from mnngpu.generation.lookahead import LookaheadGeneration
from mnngpu.generation.ngram import MAX_KEY_LEN

# The files each draft strategy loads: the config key naming one, and MNN's default name.
DRAFT_MODULES = {
    "mtp": (("mtp_model", "mtp.mnn"),),
    "eagle": (("eagle_model", "eagle.mnn"), ("eagle_fc", "eagle_fc.mnn"), ("eagle_d2t", "eagle_d2t.mnn")),
    "dflash": (("dflash_model", "dflash.mnn"), ("dflash_fc", "dflash_fc.mnn"), ("dflash_kvmat", "dflash_kvmat.mnn")),
}
SPECULATIVE_CHOICES = ("lookahead", *DRAFT_MODULES)


def create_strategy(config: LlmConfig, graph_outputs: list[str], embedding=None, placements=None):
    """The strategy for this model, or a ConfigError saying in one line why it cannot run.
    `embedding` (the base model's DiskEmbedding, which a draft head reads) and `placements` (the
    base runtime's PlacementTable, which records the draft's ops too) serve a draft head."""
    kind = config.speculative_type
    if kind == "":
        return ArGeneration()
    if kind == "lookahead":
        return _lookahead(config)
    if kind in DRAFT_MODULES:
        _check_draft_modules(config, kind, graph_outputs)
        if kind == "eagle":
            return _eagle(config, embedding, placements)
        raise ConfigError(f"'{kind}' drafts are not run by mnngpu yet (it runs lookahead and eagle); remove the "
                          "key for plain decoding", path=config.origin("speculative_type"), field="speculative_type")
    raise ConfigError(f"'{kind}' is not a strategy MNN's engine has; expected one of "
                      f"{list(SPECULATIVE_CHOICES)}", path=config.origin("speculative_type"),
                      field="speculative_type")


def _fail(config: LlmConfig, key: str, message: str):
    raise ConfigError(message, path=config.origin(key), field=key)


def _lookahead(config: LlmConfig) -> LookaheadGeneration:
    max_len = config.ngram_match_maxlen
    if max_len > MAX_KEY_LEN:
        _fail(config, "ngram_match_maxlen", f"at most {MAX_KEY_LEN} (MNN's n-gram key size), got {max_len}")
    return LookaheadGeneration(config.draft_predict_length, max_len, config.value("draft_match_strictness"),
                               config.value("draft_selection_rule"), config.value("ngram_update"),
                               _lookup_file(config))


def _eagle(config: LlmConfig, embedding, placements) -> EagleGeneration:
    if config.eagle_topk != 1:
        _fail(config, "eagle_topk", f"mnngpu runs EAGLE with eagle_topk 1 (a chain of drafts), got "
                                    f"{config.eagle_topk}: a wider token tree needs a tree attention mask in the "
                                    "verify forward, which mnngpu's Attention ops do not take")
    return EagleGeneration(config.draft_predict_length, EagleDraft.load(config, embedding, placements))


def _lookup_file(config: LlmConfig) -> Path | None:
    """The lookup text; MNN's default name is optional, a file named in the config is not."""
    path = config.lookup_file_path
    if path.is_file():
        return path
    if config.is_set("lookup_file"):
        _fail(config, "lookup_file", f"no such file: {path.name} in the model folder")
    return None


def _check_draft_modules(config: LlmConfig, kind: str, graph_outputs: list[str]) -> None:
    for key, default in DRAFT_MODULES[kind]:
        path = config.base_dir / config.get(key, default)
        if not path.is_file():
            _fail(config, "speculative_type", f"'{kind}' needs {path.name} ({key}) in the model folder, "
                                              f"which this model does not have")
    if "hidden_states" not in graph_outputs:
        _fail(config, "speculative_type", f"'{kind}' needs llm.mnn to output hidden_states, which this "
                                          "model's graph does not")
