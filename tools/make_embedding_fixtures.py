"""Make the tiny embedding-model and reranker fixtures under tests/fixtures/retrieval/ and record MNN on them.

A tiny HuggingFace model (random weights, fixed seed) with the byte-level BPE tokenizer of
tools/make_fixtures.py is exported by MNN's real exporter. `llmexport` 0.0.5 exports an embedding
model (a graph whose output is `sentence_embeddings`) only when the source folder's path names
`bge`, `gte` or `Qwen3-Embedding`, so the source is written to such a folder. MNN 3.6.1's
`txt_embedding` is then recorded for each text, each in a fresh process: MNN crashes when its
embedding model is destroyed, so the recorder prints its vector and leaves with os._exit(0).
The recording goes to embedding_reference.json.

    python -m tools.make_embedding_fixtures                   # all of them
    python -m tools.make_embedding_fixtures qwen3_embedding   # only the named ones

llmexport 0.0.5's BERT path fails under transformers 5 (its attention code expects 4-D query and
key), so a BERT (bge) source is exported by the Python that MNNGPU_TF4_PYTHON names, a venv with
transformers 4.x, torch, llmexport 0.0.5, onnx and onnxslim:

    python -m venv ~/venvs/tf4 && ~/venvs/tf4/bin/pip install 'transformers<5' torch llmexport==0.0.5 onnx onnxslim
    MNNGPU_TF4_PYTHON=~/venvs/tf4/bin/python python -m tools.make_embedding_fixtures bge_embedding
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from tools import corpus
from tools.make_fixtures import FIXTURES, HF_FILES, build_tokenizer, to_readable_json
from tools.mnn_export import (
    TELEMETRY_GUARD,
    copy_model_files,
    disable_converter_telemetry,
    export_mnn,
    folder_size,
)

# beside the LLM fixtures, whose tests take every folder of tests/fixtures/models for a chat model
RETRIEVAL = FIXTURES.parent / "retrieval"

TEXTS = [
    "hello",
    "The quick brown fox jumps over the lazy dog.",
    "Where does the farmer walk?",
    "café 日本語 👍🏽 12345",
    "The farmer walks to the river in the morning and the dog follows him across the field.",
]
REFERENCE = "embedding_reference.json"
RERANK_REFERENCE = "rerank_reference.json"
RECORD_SETTINGS = {"precision": "high", "memory": "high", "thread_num": 2}

# run in a child process: argv[1] the config, argv[2] the settings, argv[3] the text
RECORDER = """
import json, os, sys
import numpy as np
import MNN.llm as mnn_llm
model = mnn_llm.create(sys.argv[1], embedding_model=True)
model.set_config(json.loads(sys.argv[2]))
model.load()
vector = np.array(model.txt_embedding(sys.argv[3]).read(), dtype=np.float32)
print(json.dumps({"shape": list(vector.shape), "embedding": [float(v) for v in vector.ravel()]}))
sys.stdout.flush()
os._exit(0)
"""


@dataclass
class EmbeddingSpec:
    name: str
    family: str          # HF model_type
    source_name: str     # the source folder's name: it must name the kind for llmexport
    export_args: list[str]
    hf_overrides: dict = field(default_factory=dict)
    wordpiece: bool = False   # a BERT WordPiece tokenizer instead of the byte-level BPE one
    reranker: bool = False    # a Qwen3-Reranker: an ordinary LLM export, recorded as MNN's Qwen3Reranker scores
    tf4: bool = False         # exported by the transformers-4 venv's Python (MNNGPU_TF4_PYTHON)


BERT_SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]

SPECS = [
    EmbeddingSpec("qwen3_embedding", "qwen3", "Qwen3-Embedding-tiny", ["--quant_bit", "8", "--quant_block", "64"],
                  hf_overrides={"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                                "max_position_embeddings": 512, "initializer_range": 0.2}),
    # an ordinary Qwen3 causal LM (llmexport exports a Qwen3-Reranker as an LLM), scored by yes/no logits
    EmbeddingSpec("qwen3_reranker", "qwen3", "Qwen3-Reranker-tiny", ["--quant_bit", "8", "--quant_block", "64"],
                  hf_overrides={"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "num_key_value_heads": 1, "head_dim": 32,
                                "max_position_embeddings": 512, "initializer_range": 0.2}, reranker=True),
    # absolute and token-type embeddings, post-LayerNorm, GELU, CLS pooling, L2-normalized
    EmbeddingSpec("bge_embedding", "bert", "bge-tiny", ["--quant_bit", "8", "--quant_block", "64"],
                  hf_overrides={"hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
                                "num_attention_heads": 2, "max_position_embeddings": 128,
                                "initializer_range": 0.2},
                  wordpiece=True, tf4=True),
]


def build_wordpiece_tokenizer(hf_dir: Path):
    """A BERT WordPiece tokenizer (lower case) trained offline; no post-processor, since the export's
    template writes [CLS] and [SEP] itself."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(corpus.sentences(3000, seed=1),
                            trainers.WordPieceTrainer(vocab_size=480, special_tokens=BERT_SPECIAL))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                                   sep_token="[SEP]", mask_token="[MASK]")
    fast.save_pretrained(hf_dir)
    # transformers 5 names its own backend class, which the transformers-4 exporter cannot load
    config_path = hf_dir / "tokenizer_config.json"
    config_path.write_text(json.dumps({**json.loads(config_path.read_text()), "tokenizer_class": "BertTokenizerFast"},
                                      indent=2))
    return tok


def export_tf4(hf_dir: Path, out_dir: Path, *args: str) -> None:
    """llmexport 0.0.5 run by MNNGPU_TF4_PYTHON (its converter's telemetry disabled there first)."""
    python = os.environ.get("MNNGPU_TF4_PYTHON")
    if not python:
        sys.exit("error: a BERT export needs MNNGPU_TF4_PYTHON, a Python with transformers<5 (see this module's doc)")
    where = subprocess.run([python, "-c", "import importlib.util as u; print(u.find_spec('MNN').submodule_search_"
                            "locations[0]); print(u.find_spec('llmexport').submodule_search_locations[0])"],
                           capture_output=True, text=True, check=True).stdout.split()
    log_module = Path(where[0]) / "tools" / "utils" / "log.py"
    if not log_module.read_text().startswith(TELEMETRY_GUARD):
        log_module.write_text(TELEMETRY_GUARD + log_module.read_text())
    done = subprocess.run([python, "llmexport.py", "--path", str(hf_dir.resolve()), "--export", "mnn",
                           "--dst_path", str(out_dir.resolve()), *args], cwd=where[1], capture_output=True, text=True)
    if done.returncode != 0 or not (out_dir / "llm.mnn").exists():
        raise RuntimeError(f"llmexport failed for {hf_dir}:\n{done.stdout[-2000:]}{done.stderr[-4000:]}")


def build_hf_model(spec: EmbeddingSpec, hf_dir: Path, vocab_size: int) -> None:
    import torch
    import transformers

    torch.manual_seed(sum(map(ord, spec.name)))
    config = transformers.AutoConfig.for_model(spec.family, vocab_size=vocab_size, torch_dtype="float32",
                                               eos_token_id=0, pad_token_id=0, **spec.hf_overrides)
    model = (transformers.AutoModelForCausalLM if spec.reranker else transformers.AutoModel).from_config(config)
    if spec.family == "bert":   # LayerNorm weights away from 1 and biases away from 0, so a wrong use shows
        with torch.no_grad():
            for name, param in model.named_parameters():
                if "LayerNorm" in name:
                    param.add_(torch.randn_like(param) * 0.2)
    model.save_pretrained(hf_dir)


def record_text(model_dir: Path, text: str) -> dict:
    """MNN's txt_embedding of `text`, from a fresh MNN process (MNN 3.6.1's Python binding answers
    tokenizer_encode with None on an embedding model, so the ids are not recorded)."""
    done = subprocess.run([sys.executable, "-c", RECORDER, str(model_dir / "config.json"),
                           json.dumps(RECORD_SETTINGS), text], capture_output=True, text=True, check=True)
    line = next(row for row in done.stdout.splitlines() if row.startswith("{"))
    return {"text": text, **json.loads(line)}


# run in a child process: argv[1] the config, argv[2] the settings, argv[3] a JSON list of id lists
LOGITS_RECORDER = """
import json, os, sys
import numpy as np
import MNN.llm as mnn_llm
model = mnn_llm.create(sys.argv[1])
model.set_config(json.loads(sys.argv[2]))
model.load()
rows = []
for ids in json.loads(sys.argv[3]):
    model.reset()
    rows.append([float(v) for v in np.array(model.forward(ids).read(), dtype=np.float32).reshape(-1)])
print(json.dumps(rows))
sys.stdout.flush()
os._exit(0)
"""
RERANK_QUERY = "Where does the farmer walk?"
RERANK_DOCUMENTS = ["The farmer walks to the river in the morning.", "The dog sleeps under a warm loaf of bread.",
                    "café 日本語 👍🏽 12345", "The farmer walks across the field to the river."]


def record_rerank(model_dir: Path) -> dict:
    """What MNN's Qwen3Reranker computes, from MNN 3.6.1's own runtime and tokenizer: each document's
    prompt (prefix, document and suffix, each encoded on its own, as MNN's reranker does) run by a
    fresh forward, its last row's logits of the first ids of "yes" and "no", and P(yes) from them."""
    from mnngpu.engine.reranker import SUFFIX, rerank_prefix

    prefix = rerank_prefix("", RERANK_QUERY)
    encode = subprocess.run([sys.executable, "-c", (
        "import json, os, sys; import MNN.llm as m; x = m.create(sys.argv[1]); x.load(); "
        "print(json.dumps([[int(i) for i in x.tokenizer_encode(t)] for t in json.loads(sys.argv[2])])); "
        "sys.stdout.flush(); os._exit(0)"), str(model_dir / "config.json"),
        json.dumps([prefix, SUFFIX, "yes", "no", *RERANK_DOCUMENTS])], capture_output=True, text=True, check=True)
    prefix_ids, suffix_ids, yes, no, *documents = json.loads(encode.stdout.strip().splitlines()[-1])
    prompts = [prefix_ids + ids + suffix_ids for ids in documents]
    done = subprocess.run([sys.executable, "-c", LOGITS_RECORDER, str(model_dir / "config.json"),
                           json.dumps(RECORD_SETTINGS), json.dumps(prompts)], capture_output=True, text=True,
                          check=True)
    rows = json.loads(done.stdout.strip().splitlines()[-1])
    pairs = [(row[yes[0]], row[no[0]]) for row in rows]
    scores = [float(1.0 / (1.0 + np.exp(n - y))) for y, n in pairs]
    return {"settings": RECORD_SETTINGS, "recorded_by": "MNN 3.6.1 (forward, fresh per document)",
            "query": RERANK_QUERY, "instruct": "", "yes_id": yes[0], "no_id": no[0],
            "documents": [{"text": text, "ids": ids, "yes_no_logits": list(pair), "score": score}
                          for text, ids, pair, score in zip(RERANK_DOCUMENTS, prompts, pairs, scores)]}


def make_fixture(spec: EmbeddingSpec) -> Path:
    dest = RETRIEVAL / spec.name
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, out_dir = Path(tmp) / spec.source_name, Path(tmp) / "out"
        tok = build_wordpiece_tokenizer(hf_dir) if spec.wordpiece else build_tokenizer(hf_dir)
        build_hf_model(spec, hf_dir, vocab_size=tok.get_vocab_size())
        if spec.tf4:
            export_tf4(hf_dir, out_dir, *spec.export_args)
        else:
            export_mnn(hf_dir, out_dir, *spec.export_args)
        copy_model_files(out_dir, dest)
        (dest / "hf").mkdir()
        for name in HF_FILES:
            if (hf_dir / name).exists():
                shutil.copy2(hf_dir / name, dest / "hf" / name)
    if spec.reranker:
        (dest / RERANK_REFERENCE).write_text(json.dumps(record_rerank(dest), indent=1, ensure_ascii=False) + "\n")
        return dest
    reference = {"settings": RECORD_SETTINGS, "fresh_instance_per_prompt": True, "recorded_by": "MNN 3.6.1",
                 "family": spec.family, "export_args": spec.export_args,
                 "prompts": [record_text(dest, text) for text in TEXTS]}
    (dest / REFERENCE).write_text(to_readable_json(reference))
    return dest


def main() -> None:
    parser = argparse.ArgumentParser(description="Make the tiny embedding-model fixtures.")
    parser.add_argument("names", nargs="*", help="fixture names (default: all)")
    args = parser.parse_args()
    disable_converter_telemetry()
    for spec in SPECS:
        if not args.names or spec.name in args.names:
            print(f"{spec.name}: {folder_size(make_fixture(spec)) / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
