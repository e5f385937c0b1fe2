"""tokenizer.mtok (type 4): MNN's binary pipeline tokenizer, a tokenizer.json in parts.

After the text header come, little-endian: the normalizer tree, the pre-tokenizer tree, the
model (BPE, WordPiece or Unigram), the decoder tree, the added tokens, and optional trailing
fields (chat template, eos, flags, bos, then in newer MNN a post-processor program, not read here).
The tags are those of MNN's PipelineTokenizer reader. Each part is translated back to the
tokenizer.json part llmexport wrote it from, and HuggingFace's `tokenizers` runs the result.

What the exporter drops and we must choose: a table normalizer (tag 6) is NFKC or NFC by its
contents; Metaspace keeps only add_prefix_space, so it becomes prepend "always" without
splitting (MNN's behaviour); a Split pattern is always a regex.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from mnngpu.tokenizer import tokenizer_json as tj
from mnngpu.tokenizer.base import Tokenizer
from mnngpu.tokenizer.binary_reader import BinaryReader
from mnngpu.tokenizer.byte_level import CHAR_TO_BYTE
from mnngpu.tokenizer.header import TokenizerHeader
from mnngpu.tokenizer.unigram_lattice import UnigramLattice

MARKER = "\u2581"
SPLIT_BEHAVIORS = {0: "Isolated", 1: "Removed", 2: "MergedWithPrevious"}
BYTE_PIECE = re.compile(rb"<0x([0-9A-Fa-f]{2})>")


@dataclass
class DecodeRules:
    """What MNN's single-id decode applies, gathered from the decoder tree."""
    byte_level: bool = False
    wordpiece_prefix: str | None = None


@dataclass
class ModelPart:
    spec: dict
    id_to_token: dict[int, str] = field(default_factory=dict)
    byte_level_input: bool = False   # BPE over byte-level characters with no ByteLevel pre-tokenizer
    lattice: UnigramLattice | None = None   # a Unigram model, searched with MNN's tie rule


def read_norm_table(reader: BinaryReader) -> dict[int, str]:
    table = {}
    for _ in range(reader.count("normalization table entries", 6)):
        code_point = reader.u32("a code point")
        table[code_point] = reader.str("its normalized form")
    return table


def table_normalizer(table: dict[int, str]) -> dict:
    """llmexport embeds per-code-point NFKC (for NFKC, NFKD and Precompiled) or NFC tables."""
    if 0xFB01 in table:           # "ﬁ" changes only under compatibility normalization
        return {"type": "NFKC"}
    return {"type": "NFC"}


def read_normalizer(reader: BinaryReader) -> dict | None:
    start = reader.offset
    tag = reader.u8("a normalizer tag")
    if tag == 0:
        return None
    if tag == 1:
        return {"type": "NFKC"}
    if tag == 2:
        return {"type": "Prepend", "prepend": reader.str("the prepend string")}
    if tag == 3:
        pattern, content = reader.str("the pattern"), reader.str("the content")
        return {"type": "Replace", "pattern": {"String": pattern}, "content": content} if pattern else None
    if tag == 4:
        return tj.sequence("normalizer", [read_normalizer(reader) for _ in range(reader.count("normalizers", 1))])
    if tag in (5, 7):
        clean, chinese, strip, lower = (reader.u8(n) for n in ("clean_text", "handle_chinese_chars",
                                                               "strip_accents", "lowercase"))
        if tag == 7 and strip:
            read_norm_table(reader)
        return {"type": "BertNormalizer", "clean_text": bool(clean), "handle_chinese_chars": bool(chinese),
                "strip_accents": bool(strip), "lowercase": bool(lower)}
    if tag == 6:
        return table_normalizer(read_norm_table(reader))
    if tag == 8:
        left, right = reader.u8("strip_left"), reader.u8("strip_right")
        return {"type": "Strip", "strip_left": bool(left), "strip_right": bool(right)}
    raise reader.error(f"expected a normalizer tag 0-8, found {tag}", start)


def read_pre_tokenizer(reader: BinaryReader) -> dict | None:
    start = reader.offset
    tag = reader.u8("a pre-tokenizer tag")
    if tag == 0:
        return None
    if tag == 1:
        return tj.byte_level(bool(reader.u8("use_regex")))
    if tag == 2:
        return {"type": "Digits", "individual_digits": bool(reader.u8("individual_digits"))}
    if tag == 3:
        replacement, add_prefix = reader.str("the replacement"), reader.u8("add_prefix_space")
        return {"type": "Metaspace", "replacement": replacement,
                "prepend_scheme": "always" if add_prefix else "never", "split": False}
    if tag == 4:
        pattern, invert, behavior = reader.str("the split pattern"), reader.u8("invert"), reader.u8("behavior")
        if behavior not in SPLIT_BEHAVIORS:
            raise reader.error(f"expected a split behavior 0-2, found {behavior}", reader.offset - 1)
        return tj.split_regex(pattern, SPLIT_BEHAVIORS[behavior], bool(invert))
    if tag == 5:
        return {"type": "BertPreTokenizer"}
    if tag == 6:
        items = [read_pre_tokenizer(reader) for _ in range(reader.count("pre-tokenizers", 1))]
        return tj.sequence("pre_tokenizer", items)
    raise reader.error(f"expected a pre-tokenizer tag 0-6, found {tag}", start)


def read_vocab(reader: BinaryReader, count: int, with_score: bool) -> dict[int, tuple[str, float]]:
    entries = {}
    for _ in range(count):
        token = reader.str("a vocab token")
        token_id = reader.u32("its id")
        if token_id >= count:  # MNN files each token at its id in a table of the vocab size
            raise reader.error(f"expected a token id below the vocab size {count}, found {token_id}",
                               reader.offset - 4)
        entries[token_id] = (token, reader.f64("its score") if with_score else 0.0)
    return entries


def read_bpe(reader: BinaryReader, vocab_size: int) -> ModelPart:
    byte_fallback, byte_level = reader.u8("byte_fallback"), reader.u8("byte_level")
    merge_count = reader.u32("the merge count")
    id_to_token = {i: t for i, (t, _) in read_vocab(reader, vocab_size, with_score=False).items()}
    ranked = []
    for _ in range(merge_count):
        left, right, rank = reader.u32("a merge's first id"), reader.u32("its second id"), reader.u32("its rank")
        ranked.append((rank, left, right))
    vocab = {t: i for i, t in id_to_token.items()}
    merges = []
    for _, left, right in sorted(ranked):
        pair = (id_to_token.get(left), id_to_token.get(right))
        # A merge whose result is not in the vocab can never apply (MNN stops at it too).
        if None not in pair and pair[0] + pair[1] in vocab:
            merges.append(pair)
    spec = tj.bpe_model(vocab, merges, byte_fallback=bool(byte_fallback))
    return ModelPart(spec, id_to_token, byte_level_input=bool(byte_level))


def read_wordpiece(reader: BinaryReader, vocab_size: int) -> ModelPart:
    unk, prefix, max_chars = reader.str("unk_token"), reader.str("continuing_subword_prefix"), reader.u32("max chars")
    id_to_token = {i: t for i, (t, _) in read_vocab(reader, vocab_size, with_score=False).items()}
    spec = tj.wordpiece_model({t: i for i, t in id_to_token.items()}, unk, prefix, max_chars)
    return ModelPart(spec, id_to_token)


def read_unigram(reader: BinaryReader, vocab_size: int) -> ModelPart:
    unk_id, byte_fallback = reader.u32("unk_id"), reader.u8("byte_fallback")
    entries = read_vocab(reader, vocab_size, with_score=True)
    if sorted(entries) != list(range(len(entries))):
        raise reader.error("expected the Unigram ids to be 0..n-1")
    pieces = [entries[i] for i in range(len(entries))]
    unk = unk_id if unk_id < len(pieces) else None
    spec = tj.unigram_model(pieces, unk, bool(byte_fallback))
    return ModelPart(spec, {i: t for i, (t, _) in entries.items()}, lattice=UnigramLattice(pieces, unk, bool(byte_fallback)))


def read_model(reader: BinaryReader) -> ModelPart:
    start = reader.offset
    tag = reader.u8("the model tag")
    vocab_size = reader.u32("the vocab size")
    readers = {0: read_bpe, 1: read_wordpiece, 2: read_unigram}
    if tag not in readers:
        raise reader.error(f"expected a model tag 0 (BPE), 1 (WordPiece) or 2 (Unigram), found {tag}", start)
    return readers[tag](reader, vocab_size)


def read_decoder(reader: BinaryReader, rules: DecodeRules) -> None:
    start = reader.offset
    tag = reader.u8("a decoder tag")
    if tag == 0:
        rules.byte_level = True
    elif tag == 2:
        reader.str("the replacement"), reader.u8("add_prefix_space")
    elif tag == 3:
        rules.wordpiece_prefix = reader.str("the prefix")
        reader.u8("cleanup")
    elif tag == 5:
        reader.str("the pattern"), reader.str("the content")
    elif tag == 6:
        reader.str("the content"), reader.u32("start"), reader.u32("stop")
    elif tag == 7:
        for _ in range(reader.count("decoders", 1)):
            read_decoder(reader, rules)
    elif tag not in (1, 4):
        raise reader.error(f"expected a decoder tag 0-7, found {tag}", start)


def read_added_tokens(reader: BinaryReader, vocab_size: int) -> list[dict]:
    """The added tokens; their ids extend the model's vocab at most by their own count."""
    tokens = []
    count = reader.count("added tokens", 9)
    for _ in range(count):
        token_id, special = reader.u32("an added token id"), reader.u8("special")
        if token_id >= vocab_size + count:
            raise reader.error(f"expected an added token id below {vocab_size + count} (the vocab size "
                               f"{vocab_size} plus {count} added tokens), found {token_id}", reader.offset - 5)
        lstrip, rstrip = reader.u8("lstrip"), reader.u8("rstrip")
        tokens.append(tj.added_token(token_id, reader.str("the added token"), bool(special),
                                     bool(lstrip), bool(rstrip)))
    return tokens


def read_trailer(reader: BinaryReader) -> dict[str, str | None]:
    """The optional fields; each is read only while bytes remain, as MNN does."""
    trailer: dict[str, str | None] = {"chat_template": None, "eos_token": None, "bos_token": None}
    if reader.remaining >= 4:
        size = reader.u32("the chat template length")
        trailer["chat_template"] = reader._take(size, "the chat template").decode("utf-8", "replace") or None
    if reader.remaining >= 2:
        trailer["eos_token"] = reader.str("the eos token") or None
    if reader.remaining >= 1:
        reader.u8("flags")
    if reader.remaining >= 2:
        trailer["bos_token"] = reader.str("the bos token") or None
    return trailer


def mnn_single_decode(token: str, rules: DecodeRules) -> bytes:
    """MNN's decode of one id: "▁" to a space, <0xHH> to its byte, then WordPiece's prefix rule or
    the byte-level map (characters outside the byte map stay as they are)."""
    data = BYTE_PIECE.sub(lambda m: bytes([int(m.group(1), 16)]), token.replace(MARKER, " ").encode("utf-8"))
    if rules.wordpiece_prefix is not None:
        prefix = rules.wordpiece_prefix.encode("utf-8")
        return data[len(prefix):] if prefix and data.startswith(prefix) else b" " + data
    if rules.byte_level:
        text = data.decode("utf-8", errors="surrogateescape")
        return b"".join(bytes([CHAR_TO_BYTE[c]]) if c in CHAR_TO_BYTE else c.encode("utf-8", "surrogateescape")
                        for c in text)
    return data


def token_table(model: ModelPart, added: list[dict], rules: DecodeRules) -> list[bytes]:
    size = max([*model.id_to_token, *(t["id"] for t in added)], default=-1) + 1
    table = [b""] * size
    for token_id, token in model.id_to_token.items():
        table[token_id] = mnn_single_decode(token, rules)
    for token in added:
        if token["id"] not in model.id_to_token:
            table[token["id"]] = token["content"].encode("utf-8")
    return table


def load(path: Path, header: TokenizerHeader, data: bytes, body_offset: int) -> Tokenizer:
    reader = BinaryReader(path, data, body_offset)
    reader.section = "normalizer"
    normalizer = read_normalizer(reader)
    reader.section = "pre-tokenizer"
    pre_tokenizer = read_pre_tokenizer(reader)
    reader.section = "model"
    model = read_model(reader)
    reader.section = "decoder"
    rules = DecodeRules()
    read_decoder(reader, rules)
    reader.section = "added tokens"
    added = read_added_tokens(reader, len(model.id_to_token))
    reader.section = "trailer"
    trailer = read_trailer(reader)
    if model.byte_level_input:
        pre_tokenizer = tj.sequence("pre_tokenizer", [pre_tokenizer, tj.byte_level(False)])
    table = token_table(model, added, rules)
    known = {t["id"] for t in added}
    added += [tj.added_token(i, table[i].decode("utf-8", "replace"))
              for i in header.special_ids if i not in known and 0 <= i < len(table) and table[i]]
    backend = tj.build(path, model.spec, normalizer, pre_tokenizer, added)
    tokenizer = Tokenizer(path, header, backend, table, model.lattice)
    tokenizer.chat_template = trailer["chat_template"]
    tokenizer.eos_token = trailer["eos_token"]
    tokenizer.bos_token = trailer["bos_token"]
    return tokenizer
