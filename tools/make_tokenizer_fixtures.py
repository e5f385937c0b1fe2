"""Make the tokenizer fixtures: one small tokenizer file per MNN format, its source, and the truth.

    python -m tools.make_tokenizer_fixtures [--out tests/fixtures/tokenizers] [--only NAME ...]

Each fixture folder holds:
  tokenizer.txt / tokenizer.mtok   the MNN-format file under test
  source/                          the tokenizer it was made from (trained here, offline)
  reference.json                   the battery of hard strings with the source library's ids and
                                   MNN 3.6.1's ids, and MNN's tokenizer_decode of every id

Where MNN's exporter can write the format it does: `llmexport`'s own tokenizer writer
(`utils.tokenizer.LlmTokenizer.export`, the step `llmexport --export mnn` runs) reads the source
folder. It writes `tokenizer.mtok` when the source has a tokenizer.json and `tokenizer.txt`
(type 0 from a tokenizer.model, 3 from merges.txt, 2 for a BERT vocab.txt) when it has not.
Type 1 (Tiktoken) needs a remote-code tokenizer with `mergeable_ranks`, so that file is written
here by `write_tiktoken_txt`, in the exporter's layout, and proved by MNN's reader.
"""

from __future__ import annotations

import argparse
import base64
import json
import shutil
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from mnngpu.tokenizer.byte_level import chars_to_bytes
from mnngpu.tokenizer.patterns import QWEN_PATTERN
from tools.mnn_export import _package_dir, disable_converter_telemetry, save_hf_tokenizer
from tools.mnn_tokenizer import run_mnn_tokenizer
from tools.tokenizer_truth import source_encoder

FIXTURE_ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "tokenizers"
FIXTURE_NAMES = sorted(p.name for p in FIXTURE_ROOT.iterdir() if (p / "reference.json").is_file())


@cache
def reference(name: str) -> dict:
    """The recorded reference.json of fixture `name`."""
    return json.loads((FIXTURE_ROOT / name / "reference.json").read_text(encoding="utf-8"))


CHAT_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

CORPUS = [
    "Hello world, this is a tiny corpus for tokenizer tests.",
    "A quick brown fox jumps over the lazy dog. A cat sat on a mat.",
    # llmexport takes the ids before "A" in encode("A") as prefix ids, so " A" must be one token.
    "A day, A night, A year: A A A A A A A A.",
    "The year 2024 had 366 days; pi is about 3.14159 and e is 2.71828.",
    "I'm sure you're right, they'll see we'd done it. Don't worry, it's fine!",
    "def tokenize(text):\n    return [ord(c) for c in text]  # a comment\n",
    "for i in range(10):\n\tprint(i, i * i)\n\n",
    "你好，世界！这是一个用于测试分词器的小语料库。",
    "我们今天去公园散步，天气很好。中文和English混合在一起。",
    "日本語のテキストも少し入れておきます。",
    "Emoji: 👍 👍🏽 😀 😃 ❤️ 🎉 and a family 👨‍👩‍👧",
    "naïve café résumé façade coöperate",
    "Ünïcödé and Ελληνικά and Русский текст",
    "  two spaces, three   spaces, a tab\there, and a newline\nthere.",
    "Numbers: 0 1 2 3 4 5 6 7 8 9 10 100 1000 12345 67890",
    "HTTP requests: GET /index.html?q=1&r=2 returned 200 OK.",
    "Multiple lines\nof text\r\nwith different\n\nline endings.",
]


def corpus_lines() -> list[str]:
    return [line for _ in range(20) for line in CORPUS]


def battery(specials: list[str]) -> list[str]:
    """The hard strings every fixture is checked on, plus its own special tokens inside text."""
    texts = [
        "", " ", "  ", "hello world", "Hello World", "A", "  leading spaces", "trailing spaces   ",
        "a  b   c    d     e", "\t", "tab\tseparated\tvalues", "\n", "line1\nline2\r\nline3\n\n\n",
        " \n \t \r\n ", "naïve café résumé", "e\u0301 versus \u00e9", "Ångström Straße İstanbul",
        "ﬁne ① ｆｕｌｌ　ｗｉｄｔｈ", "ΑΒΓ αβγ Привет мир", "你好，世界！", "日本語のテキスト",
        "한국어 텍스트", "中文English混合123", "👍🏽", "👨‍👩‍👧‍👦", "🏳️‍🌈", "😀😃😄 ❤️",
        "0", "1234567890", "3.14159", "1,000,000", "٣٤٥ ²³", "x² + y² = z²",
        "I'm you're he'll we'd THEY'RE don't", "def f(x):\n    return x**2  # comment",
        "{'key': [1, 2, 3], \"other\": null}", "The year 2024: 50% off! Visit https://example.com/?q=1&r=2",
        "\x01\x7f control", "\u200bzero\u200bwidth \ufeffBOM", "tail\u00a0nbsp",
        "a" * 2000, "ab " * 600, " " * 300, "\n" * 200, "的" * 300, "😀" * 200, "hello " * 300,
        "9" * 500,
    ]
    for special in specials:
        texts += [f"before{special}after", f"{special}{special}", f" {special} ", f"x {special}\ny",
                  special]
    if len(specials) >= 2:
        texts.append(f"{specials[1]}user\nhi there{specials[-1]}\n{specials[1]}assistant\n")
    return texts


# ---------------------------------------------------------------- the real exporter's writer

# llmexport's tokenizer writer, run where its top-level `utils` package is importable; prints the file it wrote
LLMEXPORT_TOKENIZER = """
import sys
from utils.tokenizer import LlmTokenizer
source_dir, model_type, out_dir = sys.argv[1:]
print(LlmTokenizer.from_pretrained(source_dir, model_type=model_type).export(out_dir))
"""


def export_with_llmexport(source_dir: Path, out_dir: Path, model_type: str) -> Path:
    """Run llmexport's tokenizer writer on source_dir; returns the file it wrote."""
    disable_converter_telemetry()
    done = subprocess.run([sys.executable, "-c", LLMEXPORT_TOKENIZER, str(Path(source_dir).resolve()), model_type,
                           str(Path(out_dir).resolve())], cwd=_package_dir("llmexport"), check=True,
                          capture_output=True, text=True)
    return Path(done.stdout.splitlines()[-1])


# ---------------------------------------------------------------- sources trained offline

def train_sentencepiece(path: Path) -> None:
    """A Llama-style SentencePiece BPE: byte fallback, identity normalizer, dummy prefix."""
    import io

    import sentencepiece

    model = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(corpus_lines()), model_writer=model, model_type="bpe", vocab_size=500,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=True,
        remove_extra_whitespaces=False, split_digits=True, allow_whitespace_only_pieces=True,
        character_coverage=0.98, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
        hard_vocab_limit=False)
    path.write_bytes(model.getvalue())


def train_byte_level_bpe(vocab_size: int, pattern: str | None):
    """A byte-level BPE; `pattern` is a Split regex (Qwen style), None for ByteLevel's own regex."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    if pattern is None:
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tokenizer.normalizer = normalizers.NFC()
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(pattern), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=CHAT_SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    return tokenizer


def train_wordpiece(lowercase: bool = True):
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=lowercase)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoders.WordPiece()
    trainer = trainers.WordPieceTrainer(vocab_size=600, special_tokens=[
        "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"])
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    return tokenizer


def tiktoken_ranks(tokenizer) -> dict[bytes, int]:
    """Ranks in tiktoken's sense: every single byte first, then each merge's new token in merge order."""
    model = json.loads(tokenizer.to_str())["model"]
    ranks: dict[bytes, int] = {bytes([b]): b for b in range(256)}
    for merge in model["merges"]:
        left, right = merge if isinstance(merge, list) else merge.split(" ", 1)
        token = chars_to_bytes(left) + chars_to_bytes(right)
        ranks.setdefault(token, len(ranks))
    return ranks


def write_tiktoken_txt(path: Path, ranks: dict[bytes, int], specials: dict[str, int],
                       stop_ids: list[int]) -> None:
    """A type 1 tokenizer.txt laid out as llmexport writes one from a tiktoken tokenizer."""
    by_rank = sorted(ranks, key=ranks.get)
    assert [ranks[t] for t in by_rank] == list(range(len(by_rank)))
    lines = [base64.b64encode(token).decode() for token in by_rank]
    lines += [base64.b64encode(text.encode()).decode() for text in sorted(specials, key=specials.get)]
    special_ids = sorted(specials.values())
    header = ["430 1", f"{len(special_ids)} {len(stop_ids)} 0",
              " ".join(str(i) for i in special_ids + stop_ids) + " ", str(len(lines))]
    path.write_text("\n".join(header + lines) + "\n", encoding="utf-8")


# ---------------------------------------------------------------- one function per fixture

def make_sentencepiece(folder: Path) -> dict:
    import sentencepiece

    source = folder / "source"
    train_sentencepiece(source / "tokenizer.model")
    (source / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
        "unk_token": "<unk>", "add_bos_token": True, "add_eos_token": False, "legacy": True}))
    export_with_llmexport(source, folder, "llama")
    processor = sentencepiece.SentencePieceProcessor(model_file=str(source / "tokenizer.model"))
    specials = {processor.id_to_piece(i): i for i in (processor.unk_id(), processor.bos_id(),
                                                      processor.eos_id())}
    return {"format": "tokenizer.txt type 0 (SentencePiece)", "tokenizer_file": "tokenizer.txt",
            "source": {"library": "sentencepiece", "model": "source/tokenizer.model",
                       "prefix_ids": [processor.bos_id()], "special_tokens": specials}}


def make_tiktoken(folder: Path) -> dict:
    source = folder / "source"
    ranks = tiktoken_ranks(train_byte_level_bpe(700, QWEN_PATTERN))
    specials = {text: len(ranks) + i for i, text in enumerate(CHAT_SPECIALS)}
    (source / "tokenizer.tiktoken").write_text(
        "".join(f"{base64.b64encode(t).decode()} {r}\n" for t, r in ranks.items()))
    write_tiktoken_txt(folder / "tokenizer.txt", ranks, specials,
                       stop_ids=[specials["<|endoftext|>"], specials["<|im_end|>"]])
    return {"format": "tokenizer.txt type 1 (Tiktoken)", "tokenizer_file": "tokenizer.txt",
            "source": {"library": "tiktoken", "ranks": "source/tokenizer.tiktoken",
                       "pattern": QWEN_PATTERN, "special_tokens": specials}}


def make_bert(folder: Path) -> dict:
    source = folder / "source"
    tokenizer = train_wordpiece()
    vocab = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    (source / "vocab.txt").write_text("".join(token + "\n" for token, _ in vocab), encoding="utf-8")
    (source / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "BertTokenizer", "do_lower_case": True, "unk_token": "[UNK]",
        "sep_token": "[SEP]", "pad_token": "[PAD]", "cls_token": "[CLS]", "mask_token": "[MASK]"}))
    export_with_llmexport(source, folder, "bert")
    return {"format": "tokenizer.txt type 2 (BERT WordPiece)", "tokenizer_file": "tokenizer.txt",
            "source": {"library": "transformers", "dir": "source"}}


def make_huggingface(folder: Path) -> dict:
    source = folder / "source"
    tokenizer = train_byte_level_bpe(700, QWEN_PATTERN)
    model = json.loads(tokenizer.to_str())["model"]
    (source / "vocab.json").write_text(json.dumps(model["vocab"], ensure_ascii=False), encoding="utf-8")
    merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    (source / "merges.txt").write_text("#version: 0.2\n" + "".join(m + "\n" for m in merges),
                                       encoding="utf-8")
    (source / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "Qwen2Tokenizer", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
        "unk_token": None, "bos_token": None, "errors": "replace", "add_prefix_space": False,
        "added_tokens_decoder": {str(tokenizer.token_to_id(t)): {
            "content": t, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True} for t in CHAT_SPECIALS}}))
    export_with_llmexport(source, folder, "qwen2")
    return {"format": "tokenizer.txt type 3 (HuggingFace byte-level BPE)",
            "tokenizer_file": "tokenizer.txt", "source": {"library": "transformers", "dir": "source"}}


def _mtok_fixture(folder: Path, tokenizer, eos: str, bos: str | None, model_type: str,
                  name: str, prefix_ids: list[int]) -> dict:
    source = folder / "source"
    save_hf_tokenizer(tokenizer, source, eos=eos, pad=eos, bos=bos)
    export_with_llmexport(source, folder, model_type)
    return {"format": f"tokenizer.mtok type 4 ({name})", "tokenizer_file": "tokenizer.mtok",
            "source": {"library": "tokenizers", "file": "source/tokenizer.json",
                       "prefix_ids": prefix_ids}}


def make_mtok_qwen(folder: Path) -> dict:
    tokenizer = train_byte_level_bpe(700, QWEN_PATTERN)
    return _mtok_fixture(folder, tokenizer, "<|im_end|>", None, "qwen2", "Qwen-style byte-level BPE", [])


def make_mtok_llama(folder: Path) -> dict:
    """The SentencePiece model, converted to tokenizer.json by transformers as for Llama 2."""
    from transformers import AutoTokenizer

    with tempfile.TemporaryDirectory() as tmp:
        sp_dir = Path(tmp) / "sp"
        sp_dir.mkdir()
        train_sentencepiece(sp_dir / "tokenizer.model")
        (sp_dir / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "LlamaTokenizer", "bos_token": "<s>", "eos_token": "</s>",
            "unk_token": "<unk>", "add_bos_token": True, "legacy": True}))
        converted = AutoTokenizer.from_pretrained(str(sp_dir))
        tokenizer = converted.backend_tokenizer
    bos = tokenizer.token_to_id("<s>")
    return _mtok_fixture(folder, tokenizer, "</s>", "<s>", "llama", "SentencePiece BPE as tokenizer.json",
                         [bos])


def train_unigram():
    """A SentencePiece-style Unigram model (T5 / XLM-R style) as tokenizer.json."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.Unigram())
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    trainer = trainers.UnigramTrainer(vocab_size=500, special_tokens=["<pad>", "</s>", "<unk>"],
                                      unk_token="<unk>")
    tokenizer.train_from_iterator(corpus_lines(), trainer)
    return tokenizer


def make_mtok_unigram(folder: Path) -> dict:
    return _mtok_fixture(folder, train_unigram(), "</s>", None, "t5", "Unigram with Metaspace", [])


def make_mtok_bert(folder: Path) -> dict:
    return _mtok_fixture(folder, train_wordpiece(), "[SEP]", None, "bert", "BERT WordPiece", [])


FIXTURES = {"sentencepiece": make_sentencepiece, "tiktoken": make_tiktoken, "bert": make_bert,
            "huggingface": make_huggingface, "mtok_qwen": make_mtok_qwen,
            "mtok_llama": make_mtok_llama, "mtok_bert": make_mtok_bert, "mtok_unigram": make_mtok_unigram}


# ---------------------------------------------------------------- recording the truth

def special_texts(folder: Path, reference: dict) -> list[str]:
    """The special tokens' texts, from the header ids, decoded by the source tokenizer's vocab."""
    source = reference["source"]
    if "special_tokens" in source:
        return list(source["special_tokens"])
    from tokenizers import Tokenizer
    if source["library"] == "tokenizers":
        tokenizer = Tokenizer.from_file(str(folder / source["file"]))
    else:
        from transformers import AutoTokenizer
        tokenizer = AutoTokenizer.from_pretrained(str(folder / source["dir"])).backend_tokenizer
    return [t.content for t in tokenizer.get_added_tokens_decoder().values() if t.special]


def source_vocab_size(folder: Path, reference: dict) -> int:
    source = reference["source"]
    if source["library"] == "tokenizers":
        from tokenizers import Tokenizer
        return Tokenizer.from_file(str(folder / source["file"])).get_vocab_size(with_added_tokens=True)
    return int((folder / reference["tokenizer_file"]).read_bytes().split(b"\n")[3].split()[0])


def record(folder: Path, reference: dict) -> dict:
    texts = battery(special_texts(folder, reference))
    truth = source_encoder(folder, reference["source"])
    tokenizer_path = folder / reference["tokenizer_file"]
    mnn = run_mnn_tokenizer(tokenizer_path, texts, decode_count=source_vocab_size(folder, reference))
    reference["mnn_version"] = "3.6.1"
    reference["cases"] = [{"text": text, "source_ids": truth(text), "mnn_ids": mnn_ids}
                          for text, mnn_ids in zip(texts, mnn["ids"])]
    reference["mnn_decode"] = mnn["decode"]
    return reference


def reference_json(reference: dict) -> str:
    """JSON with one battery case per line: small, and readable in a diff."""
    head = {k: v for k, v in reference.items() if k not in ("cases", "mnn_decode")}
    lines = [json.dumps(head, ensure_ascii=False)[:-1] + ', "cases": [']
    lines += [" " + json.dumps(c, ensure_ascii=False, separators=(",", ":")) + "," for c in reference["cases"]]
    lines[-1] = lines[-1][:-1]
    lines.append('], "mnn_decode": ' + json.dumps(reference["mnn_decode"], ensure_ascii=False) + "}")
    return "\n".join(lines) + "\n"


def make_fixture(name: str, out: Path) -> None:
    folder = out / name
    shutil.rmtree(folder, ignore_errors=True)
    (folder / "source").mkdir(parents=True)
    reference = record(folder, FIXTURES[name](folder))
    (folder / "reference.json").write_text(reference_json(reference), encoding="utf-8")
    agree = sum(c["source_ids"] == c["mnn_ids"] for c in reference["cases"])
    print(f"{name}: {reference['tokenizer_file']}, MNN agrees with the source on "
          f"{agree}/{len(reference['cases'])} strings")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=FIXTURE_ROOT)
    parser.add_argument("--only", nargs="*", choices=sorted(FIXTURES), default=sorted(FIXTURES))
    args = parser.parse_args()
    for name in args.only:
        make_fixture(name, args.out)


if __name__ == "__main__":
    main()
