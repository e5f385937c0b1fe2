"""Graph and config consistency: the checks `Llm.load` runs once, before any part is used.

The readers (`mnngpu.format`, `mnngpu.embedding`, `mnngpu.config`) already verify each file
on its own. What they cannot see is whether the files agree with one another and with what
the runtime will ask of the graph. A damaged or mismatched folder fails here, with one
ModelFormatError or ConfigError naming the file and the op or key, instead of an IndexError
or a wrong shape at the first forward:

* only the ops the outputs need are kept, as MNN builds its graph back from the outputs (a C4
  export leaves dead chains that read a tensor no op writes);
* the graph is well formed for running: every op type is one mnngpu runs, every op has the
  parameter table and the inputs its op type needs, every tensor is produced once and before
  it is read, the graph takes only the inputs `Llm` feeds and gives `logits`;
* a MoE op's expert subgraphs are all present, each with one input and one output, made of
  ops mnngpu runs (runtime/moe.py inlines them at load);
* a LinearAttention's table agrees with itself and its conv_weight, in a mode mnngpu runs;
* per-layer embeddings (Gemma 4): `ple_embed_file` set exactly when the graph takes
  `ple_embeddings`, whose last dimension is `ple_embed_dim`;
* the config agrees with the graph and the weights: `hidden_size` with the `input_ids`
  input and the lm_head, the embedding's row count with the lm_head's vocab, `layer_nums`
  with the layers (Attention and LinearAttention ops), each Attention's `layer_index` unique
  and in range.
"""

from __future__ import annotations

from dataclasses import replace

from mnngpu.backend.kv import CacheLayout
from mnngpu.config import LlmConfig
from mnngpu.embedding import DiskEmbedding
from mnngpu.errors import ConfigError, ModelFormatError, WeightFileError
from mnngpu.format import Net, Op, read_net
from mnngpu.ops import linear_attention
from mnngpu.ops.op_table import ALWAYS, OPS, SOURCES, WITHOUT_SECOND_INPUT, graph_op_types
from mnngpu.runtime.moe import expert_subgraphs

# The graph inputs Llm feeds at every forward, and the output it reads.
FEEDS = ("input_ids", "attention_mask", "position_ids", "logits_index")
LOGITS = "logits"
# Fed as well when the config says so and the graph takes it (Omni): {config key: graph input}. As in
# MNN, a graph without the input runs without it: Qwen3.5's exports set has_deepstack, and only its
# vision graph has deepstack features.
OPTIONAL_FEEDS = {"has_deepstack": "deepstack_embeds"}
LAYER_OPS = ("Attention", "LinearAttention")   # one op of these per decoder layer
# Gemma 4's per-layer embedding rows: fed at every forward when ple_embed_file is set (mnngpu.embedding)
PLE_FEED = "ple_embeddings"


def validate_model(config: LlmConfig, embedding: DiskEmbedding) -> Net:
    """Check the folder's graph against itself, the config and the embedding; returns the graph."""
    config.validate_backend()
    if config.get("has_deepstack") and not config.get("is_visual"):
        raise _config_error(config, "has_deepstack", "false for a model without vision (is_visual false): "
                                                     "deepstack rows come from the vision graph")
    net = needed_ops(read_net(config.model_path))
    extra = tuple(feed for key, feed in OPTIONAL_FEEDS.items() if config.get(key) and feed in graph_inputs(net))
    check_ple_input(net, config)
    check_graph(net, extra + ((PLE_FEED,) if uses_ple(config) else ()))
    check_dimensions(net, config, embedding)
    return net


# ---- the graph on its own ----------------------------------------------------------------

def needed_ops(net: Net) -> Net:
    """The graph without the ops no output needs (its Input ops all stay: Llm feeds them)."""
    needed = {net.tensor_names.index(name) for name in net.output_names if name in net.tensor_names}
    kept = []
    for op in reversed(net.ops):
        if op.type == "Input" or needed.intersection(op.outputs):
            kept.append(op)
            needed.update(op.inputs)
    return net if len(kept) == len(net.ops) else replace(net, ops=kept[::-1])


def runnable_op_types() -> set[str]:
    """The op types a graph may use: the op table's (less the engine's own fused nodes) and the sources."""
    return set(graph_op_types()) | set(SOURCES)


def check_graph(net: Net, extra_feeds: tuple[str, ...] = ()) -> None:
    """Raise ModelFormatError for the first op the runtime could not run as the graph says;
    `extra_feeds` are inputs the config makes the engine feed as well (each one the graph must take)."""
    runnable = runnable_op_types()
    produced: set[int] = set()
    for position, op in enumerate(net.ops):
        where = _where(position, op)
        if op.type not in runnable:
            raise _error(net, f"an op type mnngpu runs, got {op.type}", where)
        if op.param_type.startswith("UNKNOWN("):
            raise _error(net, f"a parameter table type from MNN's schema, got {op.param_type}", where)
        _check_param(net, op, where)
        _check_arity(net, op, where)
        if op.type == "MoE":
            _check_experts(net, op, where, runnable)
        if op.type == "LinearAttention":
            _check_linear_attention(net, op, where)
        for tensor in op.inputs:
            if tensor not in produced:
                raise _error(net, f"input tensor {tensor} ({_name(net, tensor)}) to be produced by an earlier op",
                             where)
        for tensor in op.outputs:
            if tensor in produced:
                raise _error(net, f"output tensor {tensor} ({_name(net, tensor)}) produced only once", where)
            produced.add(tensor)
    _check_interface(net, extra_feeds)


def _check_experts(net: Net, op: Op, where: str, runnable: set[str]) -> None:
    """A MoE op's expert subgraphs are present, well formed and made of ops mnngpu runs."""
    for graph in expert_subgraphs(net, op, where):
        for position, sub_op in enumerate(graph.ops):
            if sub_op.type not in runnable:
                raise _error(net, f"an op type mnngpu runs, got {sub_op.type}",
                             f"subgraphs['{graph.name}'].nodes[{position}] ({sub_op.name})")


def _check_linear_attention(net: Net, op: Op, where: str) -> None:
    """The table's head dims agree with each other and with the conv_weight Const, and its mode is one
    mnngpu runs (mnngpu/ops/linear_attention.py)."""
    param = op.param
    problem = linear_attention.decline_table(param)
    if problem is not None:
        field, expected = problem
        raise _error(net, expected, f"{where}.{field}")
    dims = _conv_weight_dims(net, op)
    if dims is not None:
        weight_problem = linear_attention.conv_weight_problem(param, dims)
        if weight_problem is not None:
            raise _error(net, weight_problem, f"{where}.head_v_dim")
    reason = linear_attention.decline_mode(param)
    if reason is not None:
        raise ModelFormatError(reason, path=net.path, field=f"{where}.attn_type")


def _conv_weight_dims(net: Net, op: Op) -> tuple[int, ...] | None:
    """The dims of a LinearAttention's conv_weight (input 3) where a Const holds it, else None."""
    weight = next((source for source in net.ops if op.inputs[3] in source.outputs), None)
    return tuple(weight.param.dims or ()) if weight is not None and weight.type == "Const" else None


def _check_param(net: Net, op: Op, where: str) -> None:
    if op.type in SOURCES:
        expected, required = SOURCES[op.type], True
    else:
        spec = OPS[op.type]
        expected = spec.param
        required = spec.param_required == ALWAYS or (spec.param_required == WITHOUT_SECOND_INPUT
                                                     and len(op.inputs) < 2)
    if expected is None:
        return
    if op.param is None and not required:
        return
    if op.param_type != expected or op.param is None:
        raise _error(net, f"a {expected} parameter table for a {op.type} op, got {op.param_type}", where)


def _check_arity(net: Net, op: Op, where: str) -> None:
    if op.type in SOURCES:
        if op.inputs or len(op.outputs) != 1:
            raise _error(net, f"a {op.type} op with no inputs and one output, got {len(op.inputs)} and "
                              f"{len(op.outputs)}", where)
        return
    need = OPS[op.type].min_inputs
    if len(op.inputs) < need or not op.outputs:
        raise _error(net, f"a {op.type} op with at least {need} input(s) and an output, got {len(op.inputs)} "
                          f"and {len(op.outputs)}", where)


def graph_inputs(net: Net) -> list[str]:
    """The names of the graph's Input ops."""
    return [op.name for op in net.ops if op.type == "Input"]


def _check_interface(net: Net, extra_feeds: tuple[str, ...]) -> None:
    inputs = graph_inputs(net)
    fed = (*FEEDS, *extra_feeds)
    unknown = [name for name in inputs if name not in fed]
    if unknown:
        raise _error(net, f"graph inputs among {list(fed)} (what Llm feeds), got {unknown}", "Input ops")
    if "input_ids" not in inputs:
        raise _error(net, f"an Input op named input_ids, got {inputs}", "Input ops")
    if LOGITS not in net.output_names:
        raise _error(net, f"an output named {LOGITS}, got {net.output_names}", "outputName")
    if LOGITS not in net.tensor_names:
        raise _error(net, f"a tensor named {LOGITS} (the declared output)", "tensorName")


# ---- the graph against the config and the embedding --------------------------------------

def check_hidden_size(net: Net, config: LlmConfig) -> None:
    """hidden_size as the graph states it (its input_ids input and its lm_head)."""
    hidden = config.hidden_size
    input_ids = next((op for op in net.ops if op.type == "Input" and op.name == "input_ids"), None)
    dims = (input_ids.param.dims or []) if input_ids is not None and input_ids.param is not None else []
    if dims and dims[-1] > 0 and dims[-1] != hidden:
        raise _config_error(config, "hidden_size", f"{dims[-1]}, the last dimension of the graph's input_ids "
                                                   f"in {net.path}, got {hidden}")
    lm_head = find_lm_head(net)
    common = lm_head.param.common if lm_head is not None else None
    if common is not None and common.inputCount != hidden:
        raise _config_error(config, "hidden_size", f"{common.inputCount}, the input size of the lm_head "
                                                   f"'{lm_head.name}' in {net.path}, got {hidden}")


def check_dimensions(net: Net, config: LlmConfig, embedding: DiskEmbedding) -> None:
    """hidden_size, the vocab and layer_nums as the graph and the weights state them."""
    check_hidden_size(net, config)
    lm_head = find_lm_head(net)
    if lm_head is not None:
        common = lm_head.param.common
        if common is not None and common.outputCount != embedding.vocab_size:
            raise WeightFileError(f"as many embedding rows as the lm_head '{lm_head.name}' has outputs "
                                   f"({common.outputCount}, the vocab), got {embedding.vocab_size}",
                                   path=embedding.path, field="rows")
    _check_layers(net, config)


def find_lm_head(net: Net, max_steps: int = 16) -> Op | None:
    """The Convolution that `logits` comes from, following first inputs back through reshapes."""
    producer = {tensor: op for op in net.ops for tensor in op.outputs}
    op = producer.get(net.tensor_names.index(LOGITS))
    for _ in range(max_steps):
        if op is None or op.type == "Convolution":
            return op
        op = producer.get(op.inputs[0]) if op.inputs else None
    return None


def _check_layers(net: Net, config: LlmConfig) -> None:
    layers = [op for op in net.ops if op.type in LAYER_OPS]
    if not layers:
        return
    if config.layer_nums != len(layers):
        raise _config_error(config, "layer_nums", f"{len(layers)}, the Attention and LinearAttention ops in "
                                                  f"{net.path}, got {config.layer_nums}")
    seen: set[int] = set()
    for op in layers:
        index = op.param.layer_index if op.type == "Attention" else -1
        if index >= 0 and (index >= len(layers) or index in seen):
            raise ModelFormatError(f"a layer_index unique and in [0, {len(layers)}), got {index}",
                                   path=net.path, field=f"{op.name}.layer_index")
        seen.add(index)


def uses_ple(config: LlmConfig) -> bool:
    """Whether the model has per-layer embeddings (ple_embed_file set, as MNN's has_ple)."""
    return config.get("ple_embed_file") is not None


def check_ple_input(net: Net, config: LlmConfig) -> None:
    """ple_embed_file is set exactly when the graph takes ple_embeddings, and ple_embed_dim is the
    input's width."""
    ple_input = next((op for op in net.ops if op.type == "Input" and op.name == PLE_FEED), None)
    if not uses_ple(config):
        if ple_input is not None:
            raise ConfigError(f"set: the graph {net.path} takes {PLE_FEED} (Gemma 4's per-layer embeddings), "
                              "and this key names their file", path=config.base_dir / config.value("llm_config"),
                              field="ple_embed_file")
        return
    if ple_input is None:
        raise _config_error(config, "ple_embed_file", f"a graph with a {PLE_FEED} input; {net.path} has none")
    width = (ple_input.param.dims or [0])[-1]
    dim = config.value("ple_embed_dim")
    if dim <= 0 or (width > 0 and width != dim):
        raise _config_error(config, "ple_embed_dim", f"{width}, the last dimension of the graph's {PLE_FEED} "
                                                     f"in {net.path}, got {dim}")


def has_recurrent_state(net: Net) -> bool:
    """Whether the graph keeps a recurrent state besides its KV cache (LinearAttention ops)."""
    return any(op.type == "LinearAttention" for op in net.ops)


def cache_layout(net: Net) -> CacheLayout:
    """What the graph caches per sequence (the prefix cache checks its files against it): the
    Attention layers' keys and values, and each LinearAttention's state, whose convolution history
    is as long as its conv_weight Const's kernel - 1."""
    states = {}
    for position, op in enumerate(net.ops):
        if op.type != "LinearAttention":
            continue
        dims = _conv_weight_dims(net, op)
        if dims is None or len(dims) != 3:
            raise _error(net, "a conv_weight (input 3) that is a Const of (channels, 1, kernel), whose kernel "
                              f"sizes the recurrent state, got {dims or 'no Const'}",
                         f"{_where(position, op)}.inputs[3]")
        states[op.name] = linear_attention.state_shapes(op.param, dims[2])
    kv_layers = tuple(sorted(op.param.layer_index for op in net.ops if op.type == "Attention"))
    return CacheLayout(kv_layers, states)


# ---- messages ----------------------------------------------------------------------------

def _where(position: int, op: Op) -> str:
    return f"oplists[{position}] ({op.name or op.type})"


def _name(net: Net, tensor: int) -> str:
    return net.tensor_names[tensor] if 0 <= tensor < len(net.tensor_names) else "?"


def _error(net: Net, expected: str, where: str) -> ModelFormatError:
    return ModelFormatError(f"expected {expected}", path=net.path, field=where)


def _config_error(config: LlmConfig, key: str, expected: str) -> ConfigError:
    return ConfigError(f"expected {expected}", path=config.origin(key), field=key)
