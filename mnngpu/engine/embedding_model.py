"""EmbeddingModel: an export whose graph ends in `sentence_embeddings` (llmexport's embedding
path), run as MNN's `Embedding` runs it, and several texts in one forward.

    model = llm.create("Qwen3-Embedding/config.json", embedding_model=True)
    model.load()
    vector = model.txt_embedding("hello")        # (1, hidden), as MNN returns it
    vectors = model.embed(["hello", "world"])    # (2, hidden), one packed forward

MNN feeds such a graph a mask of ones for every (query, key) pair, which its attention adds to the
scores: every token sees every other, with no KV cache. Its exporter ends the graph at one row
(the last token's for a decoder) after the final norm. So that one forward can embed many texts,
the graph is changed at load in two ways: its Attention ops run without a cache over an additive
mask (block-diagonal, one block a text, when texts are packed), and its pooling Gather takes the
rows the new input `row_index` names (each text's last row, or its first for a CLS-pooled model)
from the hidden states laid flat, so the graph returns one row per text.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mnngpu.config import LlmConfig, as_overrides
from mnngpu.embedding import DiskEmbedding
from mnngpu.errors import InputError, MnnGpuError, ModelFormatError
from mnngpu.format import Net, read_net
from mnngpu.format.net import Op
from mnngpu.format.params import Input, Reshape
from mnngpu.runtime.module import Module, ModuleConfig
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.tokenizer import load_tokenizer

EMBEDDING_OUTPUT = "sentence_embeddings"
ROW_INDEX = "row_index"
# Tokens per packed forward. Every text's queries are scored against every key of the pack, so a
# larger pack wastes more (measured on a bge-small shape, 2 CPU cores: 128 to 256 tokens best).
PACKED_TOKENS = 256
TOKEN_STEP = 32   # a packed forward's length is a multiple of this
# The mask input under another name than MNN's attention_mask: that one is a host input (a KV
# graph's key window), part of the resize key by its values; this one is data on the device.
PACK_MASK = "pack_mask"
MASKED = np.finfo(np.float32).min


class Embeddings(np.ndarray):
    """float32 vectors that also answer MNN's `Var.read()`, so code written for MNN runs as is."""

    def read(self) -> np.ndarray:
        return np.asarray(self)


# how llmexport 0.0.5's embedding graph pools, by the source's model_type: (the row, normalized)
POOLING = {"qwen3": ("last token after the final norm", False), "bert": ("CLS token", True),
           "new": ("CLS token", True)}
FIRST_ROW = ("bert", "new")   # the model types whose pooled row is a text's first (CLS); others its last


def unit_vectors(vectors: np.ndarray, dimensions: int | None = None) -> np.ndarray:
    """Rows cut to their first `dimensions` values (Matryoshka truncation), then scaled to length 1;
    a zero row stays zero."""
    vectors = np.asarray(vectors, dtype=np.float32)
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    norms = np.linalg.norm(vectors, axis=1, keepdims=True)
    return vectors / np.where(norms > 0, norms, 1.0)


def is_embedding_graph(net: Net) -> bool:
    return EMBEDDING_OUTPUT in net.output_names


def model_kind(net: Net, model_type: str | None) -> dict:
    """{"kind": "embedding" | "llm", "pooling": how the vector is made, or None for an LLM}."""
    if not is_embedding_graph(net):
        return {"kind": "llm", "pooling": None}
    row, normalized = POOLING.get(model_type or "", ("unknown", False))
    return {"kind": "embedding", "pooling": f"{row}, {'L2-normalized' if normalized else 'not normalized'}"}


def position_table_rows(net: Net) -> int | None:
    """The rows of an absolute position-embedding table (BERT's: a Gather of a constant by indices
    computed from position_ids), or None. The exporter's graph takes positions modulo the table's
    rows, so a longer text would wrap around silently: its limit."""
    producer = {index: op for op in net.ops for index in op.outputs}
    reached = {op.outputs[0] for op in net.ops if op.type == "Input" and op.name == "position_ids"}
    for op in net.ops:
        if not reached.intersection(op.inputs):
            continue
        table = producer.get(op.inputs[0])
        if op.type == "GatherV2" and op.inputs[1] in reached and table is not None and table.type == "Const":
            return int(table.param.dims[0])
        reached.update(op.outputs)
    return None


def refuse_embedding_graph(model_path) -> None:
    """Raise, naming the kind, when the graph at model_path is an embedding model's (an Llm cannot run it)."""
    net = read_net(model_path)
    if is_embedding_graph(net):
        raise ModelFormatError("this is an embedding model (its graph ends in sentence_embeddings), not a chat "
                               "model: create it with embedding_model=True (mnngpu embed, POST /v1/embeddings)",
                               path=model_path, field="outputName")


def _pooled_gather(net: Net) -> Op:
    """The GatherV2 that picks the pooled row (CLS or last token) on its way to sentence_embeddings."""
    producer = {index: op for op in net.ops for index in op.outputs}
    output = net.tensor_names.index(EMBEDDING_OUTPUT)
    op = producer[output]
    while op.type != "GatherV2":
        if not op.inputs:
            raise ModelFormatError("no GatherV2 picks the pooled row before sentence_embeddings", path=net.path,
                                   field="oplists")
        op = producer[op.inputs[0]]
    return op


def packed_graph(net: Net, hidden_size: int) -> Net:
    """`net` changed to embed packed texts: Attention without a KV cache over the additive mask (the
    input PACK_MASK), and the pooled Gather picking rows [texts, hidden] of the hidden states laid flat [tokens, hidden]
    by the new input ROW_INDEX, so the ops after it (a norm over the last axis) see a batch."""
    if not is_embedding_graph(net):
        raise ModelFormatError(f"not an embedding model: the graph's outputs are {net.output_names}, not "
                               f"{EMBEDDING_OUTPUT} (llmexport writes it for bge, gte and Qwen3-Embedding)",
                               path=net.path, field="outputName")
    ops = [dataclasses.replace(op, param=dataclasses.replace(op.param, kv_cache=False)) if op.type == "Attention"
           else dataclasses.replace(op, name=PACK_MASK) if op.type == "Input" and op.name == "attention_mask"
           else op for op in net.ops]
    gather = _pooled_gather(net)
    flat, rows = len(net.tensor_names), len(net.tensor_names) + 1
    flatten = Op(type="Reshape", name="pooled_rows_flat", inputs=[gather.inputs[0]], outputs=[flat],
                 param_type="Reshape", param=Reshape(dims=[-1, hidden_size], dimType="NCHW"))
    row_input = Op(type="Input", name=ROW_INDEX, inputs=[], outputs=[rows], param_type="Input",
                   param=Input(dims=[-1], dtype="DT_INT32", dformat="NCHW"))
    pick = dataclasses.replace(gather, inputs=[flat, rows])   # no axis input: axis 0
    ops = [row_input] + [x for op in ops for x in ((flatten, pick) if op is gather else (op,))]
    names = [PACK_MASK if name == "attention_mask" else name for name in net.tensor_names]
    return dataclasses.replace(net, ops=ops, tensor_names=[*names, "pooled_rows_flat", ROW_INDEX],
                               tensor_number=max(net.tensor_number, rows + 1))


def _round_up(count: int, step: int) -> int:
    return -(-count // step) * step


def packed_feeds(rows: list[np.ndarray], first_row: bool = False) -> dict[str, np.ndarray]:
    """The graph inputs for texts' embedding rows [tokens, hidden] each, packed into one sequence:
    each text at positions from 0, seeing only its own tokens; the pooled row of each is its last,
    or with `first_row` its first (CLS). The sequence is padded to a multiple of TOKEN_STEP and the
    pooled rows to a power of two (padding rows see only themselves; padding picks row 0), so that
    forwards of similar size have one shape and reuse one resized pipeline."""
    used = sum(len(part) for part in rows)
    total = _round_up(used, TOKEN_STEP)
    mask = np.full((total, total), MASKED, dtype=np.float32)
    mask[np.arange(used, total), np.arange(used, total)] = 0.0
    positions = np.zeros(total, dtype=np.int32)
    picked = np.zeros(1 << (len(rows) - 1).bit_length(), dtype=np.int32)
    embeds = np.zeros((total, rows[0].shape[1]), dtype=np.float32)
    start = 0
    for index, part in enumerate(rows):
        stop = start + len(part)
        mask[start:stop, start:stop] = 0.0
        positions[start:stop] = np.arange(len(part))
        embeds[start:stop] = part
        picked[index] = start if first_row else stop - 1
        start = stop
    return {"input_ids": embeds[None], PACK_MASK: mask.reshape(1, 1, total, total),
            "position_ids": positions.reshape(1, total), ROW_INDEX: picked}


class EmbeddingModel:
    """MNN's Embedding: load(), txt_embedding(text), ids_embedding(ids), and embed(texts) batched."""

    kind = "embedding"

    def __init__(self, config: LlmConfig):
        self.config = config
        self._loaded = False
        self.positions: int | None = None   # a position table's rows, read at load (position_table_rows)

    def set_config(self, overrides: str | dict) -> bool:
        self.config.set_config(as_overrides(overrides))
        return True

    def load(self) -> None:
        cfg = self.config
        self.tokenizer = load_tokenizer(cfg.base_dir, cfg.tokenizer_file)
        cfg.merge_context_file()
        self.runtime = RuntimeManager.from_config(cfg)
        self.embedding = DiskEmbedding(cfg.hidden_size, cfg.embedding_path, cfg.weight_path, cfg.tie_embeddings,
                                       cfg.origin("tie_embeddings"))
        exported = read_net(cfg.model_path)
        self.positions = position_table_rows(exported)
        net = packed_graph(exported, cfg.hidden_size)
        self.module = Module.load(cfg.model_path, cfg.weight_path,
                                  ModuleConfig(shape_mutable=not self.runtime.fixed_shape, rearrange=True),
                                  self.runtime, net=net)
        from mnngpu.prompt import Prompt

        self.prompt = Prompt(cfg.raw, tokenizer_template=self.tokenizer.chat_template or "",
                             tokenizer_eos=self.tokenizer.eos_token or "",
                             tokenizer_bos=self.tokenizer.bos_token or "")
        self._loaded = True

    @property
    def dim(self) -> int:
        return self.config.hidden_size

    @property
    def max_tokens(self) -> int:
        """The most tokens one text may have: max_all_tokens, and no more than a position table holds."""
        return min(self.config.max_all_tokens, self.positions or self.config.max_all_tokens)

    def _require_loaded(self) -> None:
        if not self._loaded:
            raise MnnGpuError("call load() first")

    # ---- text to ids ----------------------------------------------------------------------------
    def apply_chat_template(self, text: str) -> str:
        """`text` in the export's template (Qwen3-Embedding's appends <|endoftext|>)."""
        self._require_loaded()
        return self.prompt.apply_chat_template(text)

    def tokenizer_encode(self, text: str) -> list[int]:
        self._require_loaded()
        return self.tokenizer.encode(text)

    def prompt_ids(self, text: str) -> list[int]:
        """The ids txt_embedding embeds for `text`: the template applied, then encoded."""
        if not isinstance(text, str):
            raise InputError(f"a text to embed is a string, got {type(text).__name__}", field="input")
        if not text:
            raise InputError("an empty string has nothing to embed", field="input")
        return self.tokenizer_encode(self.apply_chat_template(text))

    def checked_ids(self, ids) -> list[int]:
        """`ids` as ints, checked: a non-empty 1-D list inside the vocabulary and the length limit."""
        array = np.asarray(ids)
        if array.ndim != 1 or array.size == 0 or not np.issubdtype(array.dtype, np.integer):
            raise InputError("token ids to embed are a non-empty list of integers", field="input")
        vocab = self.embedding.vocab_size
        bad = array[(array < 0) | (array >= vocab)]
        if bad.size:
            raise InputError(f"token id {int(bad[0])} is outside the vocabulary [0, {vocab})", field="input")
        if array.size > self.max_tokens:
            limit = "its position table's rows" if self.max_tokens == self.positions else "max_all_tokens"
            raise InputError(f"{array.size} tokens exceed the model's limit of {self.max_tokens} ({limit})",
                             field="input")
        return [int(i) for i in array]

    # ---- the forward ----------------------------------------------------------------------------
    def embed_ids(self, batches: list[list[int]]) -> np.ndarray:
        """One vector per id list [texts, hidden], as MNN's ids_embedding computes each; the lists
        are packed into as few forwards as PACKED_TOKENS allows."""
        self._require_loaded()
        batches = [self.checked_ids(ids) for ids in batches]
        vectors, group, count = [], [], 0
        for ids in batches:
            if group and count + len(ids) > PACKED_TOKENS:
                vectors.append(self._forward(group))
                group, count = [], 0
            group.append(ids)
            count += len(ids)
        if group:
            vectors.append(self._forward(group))
        return np.concatenate(vectors, axis=0) if vectors else np.zeros((0, self.dim), np.float32)

    def _forward(self, batches: list[list[int]]) -> np.ndarray:
        feeds = packed_feeds([self.embedding.rows(ids) for ids in batches],
                             first_row=self.config.get("model_type") in FIRST_ROW)
        out, = self.module.forward(feeds, [EMBEDDING_OUTPUT])
        return np.asarray(out, dtype=np.float32).reshape(-1, self.dim)[:len(batches)]

    def ids_embedding(self, ids) -> Embeddings:
        """The vector (1, hidden) for token ids, as MNN's ids_embedding returns it."""
        return np.ascontiguousarray(self.embed_ids([ids])).view(Embeddings)

    def txt_embedding(self, text: str) -> Embeddings:
        """The vector (1, hidden) for a text: the template applied, encoded, embedded (as MNN's)."""
        return self.ids_embedding(self.prompt_ids(text))

    def rerank(self, query: str, documents: list[str]) -> list[float]:
        """An embedding model gives vectors, not relevance scores: say so, and what does rerank."""
        raise MnnGpuError(f"{self.config.model_path}: an embedding model (model_type "
                          f"{self.config.get('model_type')}) gives vectors, not rerank scores; a Qwen3-Reranker "
                          "export reranks (mnngpu.llm.Qwen3Reranker, mnngpu rerank)")

    def embed(self, texts: list[str]) -> np.ndarray:
        """txt_embedding of each text [texts, hidden], in packed forwards."""
        if isinstance(texts, str):
            texts = [texts]
        return self.embed_ids([self.prompt_ids(text) for text in texts])
