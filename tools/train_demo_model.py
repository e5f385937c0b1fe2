"""Train the bundled demo model and export it with MNN's real exporter into mnngpu/demo/model/.

A small Qwen2 (hidden 256, 4 layers, 4 heads / 2 KV heads, intermediate 768) with a byte-level
BPE tokenizer, trained for a few minutes on CPU on tools/demo_corpus.py's generated text
(stories, dialogue, facts, ChatML exchanges). Only the exported MNN files ship; the HuggingFace
folder lives in a temporary directory unless --keep-hf is given.

    pip install -e '.[fixtures,test]'
    python -m tools.train_demo_model                 # about 4 minutes on 2 cores
    python -m tools.train_demo_model --steps 50 --out /some/dir   # a quick trial run
"""

from __future__ import annotations

import argparse
import json
import math
import random
import shutil
import tempfile
import time
from pathlib import Path

from tools import demo_corpus
from tools.mnn_export import copy_model_files, export_mnn, save_hf_tokenizer, train_bpe_tokenizer

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "mnngpu" / "demo" / "model"
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
EXPORT_ARGS = ("--quant_bit", "4", "--quant_block", "64")
TRAIN_DOCUMENTS, TRAIN_CHATS, HELDOUT_DOCUMENTS = 20000, 4000, 24
MODEL_SHAPE = {
    "hidden_size": 256, "intermediate_size": 768, "num_hidden_layers": 4, "num_attention_heads": 4,
    "num_key_value_heads": 2, "max_position_embeddings": 2048, "tie_word_embeddings": False,
}
# A demo should answer the same way every time and on every backend, so it decodes greedily;
# 64 new tokens hold most of one story.
DEMO_RUNTIME_CONFIG = {"max_new_tokens": 64, "sampler_type": "greedy", "thread_num": 2}


def training_documents() -> list[str]:
    docs = demo_corpus.documents(TRAIN_DOCUMENTS, demo_corpus.TRAIN_SEED)
    docs += demo_corpus.chat_documents(TRAIN_CHATS, demo_corpus.CHAT_SEED)
    random.Random(demo_corpus.TRAIN_SEED).shuffle(docs)
    return docs


def token_stream(tok, docs: list[str]):
    """All documents as one int64 tensor, each one preceded by <|endoftext|>."""
    import torch

    eot = tok.token_to_id("<|endoftext|>")
    ids: list[int] = []
    for encoding in tok.encode_batch(docs):
        ids.append(eot)
        ids.extend(encoding.ids)
    return torch.tensor(ids, dtype=torch.long)


def build_model(vocab_size: int, eos: int, pad: int):
    import transformers

    config = transformers.Qwen2Config(vocab_size=vocab_size, eos_token_id=eos, bos_token_id=pad,
                                      pad_token_id=pad, torch_dtype="float32", **MODEL_SHAPE)
    model = transformers.Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = eos
    return model


def learning_rate(step: int, steps: int, peak: float, warmup: int = 30) -> float:
    """Linear warm-up, then cosine decay to a tenth of the peak."""
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup) / max(1, steps - warmup)
    return peak * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


def train(model, stream, steps: int, batch: int, seq: int, peak_lr: float) -> None:
    import torch

    generator = torch.Generator().manual_seed(demo_corpus.TRAIN_SEED)
    optimizer = torch.optim.AdamW(model.parameters(), lr=peak_lr, betas=(0.9, 0.95), weight_decay=0.1)
    model.train()
    started = time.time()
    for step in range(steps):
        starts = torch.randint(0, len(stream) - seq, (batch,), generator=generator)
        window = torch.stack([stream[s:s + seq] for s in starts.tolist()])  # (batch, seq)
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(step, steps, peak_lr)
        loss = model(input_ids=window, labels=window).loss  # the model shifts labels itself
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if step % 50 == 0 or step == steps - 1:
            print(f"step {step:4d}  loss {loss.item():.3f}  {time.time() - started:6.1f} s", flush=True)
    model.eval()


def heldout_perplexity(model, tok, docs: list[str]) -> float:
    """exp(mean NLL) of every document token, each document after <|endoftext|>."""
    import torch

    eot = tok.token_to_id("<|endoftext|>")
    total, count = 0.0, 0
    with torch.no_grad():
        for doc in docs:
            ids = torch.tensor([[eot] + tok.encode(doc).ids])
            logits = model(input_ids=ids).logits[0, :-1].float()
            total += torch.nn.functional.cross_entropy(logits, ids[0, 1:], reduction="sum").item()
            count += ids.shape[1] - 1
    return math.exp(total / count)


def greedy_sample(model, tok, prompt: str, new_tokens: int = 48) -> str:
    import torch

    ids = torch.tensor([tok.encode(prompt).ids])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=new_tokens, do_sample=False)
    return tok.decode(out[0, ids.shape[1]:].tolist(), skip_special_tokens=False)


def copy_shipped_files(export_dir: Path, out_dir: Path) -> None:
    """The MNN files only, with the demo's runtime defaults written into config.json."""
    copy_model_files(export_dir, out_dir)
    config_path = out_dir / "config.json"
    config = json.loads(config_path.read_text())
    config.update(DEMO_RUNTIME_CONFIG)
    config_path.write_text(json.dumps(config, indent=4) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description="Train and export the bundled demo model.")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where the MNN files go")
    parser.add_argument("--steps", type=int, default=420)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--keep-hf", type=Path, help="also keep the HuggingFace folder here")
    args = parser.parse_args()

    import torch

    torch.set_num_threads(2)
    torch.manual_seed(demo_corpus.TRAIN_SEED)
    docs = training_documents()
    tok = train_bpe_tokenizer(docs, vocab_size=4000, special_tokens=SPECIAL_TOKENS)
    stream = token_stream(tok, docs)
    print(f"corpus: {len(docs)} documents, {len(stream)} tokens, vocab {tok.get_vocab_size()}")

    model = build_model(tok.get_vocab_size(), eos=tok.token_to_id("<|im_end|>"),
                        pad=tok.token_to_id("<|endoftext|>"))
    train(model, stream, args.steps, args.batch, args.seq, args.lr)

    heldout = demo_corpus.documents(HELDOUT_DOCUMENTS, demo_corpus.HELDOUT_SEED)
    baseline = demo_corpus.unigram_perplexity(stream.tolist(), [tok.encode(d).ids for d in heldout],
                                              tok.get_vocab_size())
    print(f"held-out perplexity {heldout_perplexity(model, tok, heldout):.2f}, unigram baseline {baseline:.2f}")
    print("sample:", greedy_sample(model, tok, "Once upon a time,"))
    print("chat sample:", greedy_sample(
        model, tok, "<|im_start|>user\nTell me a story about a fox.<|im_end|>\n<|im_start|>assistant\n"))

    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, export_dir = Path(tmp) / "hf", Path(tmp) / "mnn"
        model.save_pretrained(hf_dir)
        save_hf_tokenizer(tok, hf_dir, eos="<|im_end|>", pad="<|endoftext|>")
        if args.keep_hf:
            shutil.copytree(hf_dir, args.keep_hf, dirs_exist_ok=True)
        export_mnn(hf_dir, export_dir, *EXPORT_ARGS)
        copy_shipped_files(export_dir, args.out)
    size = sum(p.stat().st_size for p in args.out.iterdir())
    print(f"wrote {args.out}: {size / 1e6:.2f} MB")


if __name__ == "__main__":
    main()
