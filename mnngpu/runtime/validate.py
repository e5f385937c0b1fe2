"""Graph and config consistency: the checks `Llm.load` runs once, before any part is used.

The readers (`mnngpu.format`, `mnngpu.embedding`, `mnngpu.config`) already verify each file
on its own. What they cannot see is whether the files agree with one another and with what
the runtime will ask of the graph. A damaged or mismatched folder fails here, with one
ModelFormatError or ConfigError naming the file and the op or key, instead of an IndexError
or a wrong shape at the first forward:

* the graph is well formed for running: every op type is one mnngpu runs, every op has the
  parameter table and the inputs its op type needs, every tensor is produced once and before
  it is read, the graph takes only the inputs `Llm` feeds and gives `logits`;
* a MoE op's expert subgraphs are all present, each with one input and one output, made of
  ops mnngpu runs (runtime/moe.py inlines them at load);
* the config agrees with the graph and the weights: `hidden_size` with the `input_ids`
  input and the lm_head, the embedding's row count with the lm_head's vocab, `layer_nums`
  with the Attention ops, each Attention's `layer_index` unique and in range.
"""

from __future__ import annotations

from mnngpu.config import LlmConfig
from mnngpu.embedding import DiskEmbedding
from mnngpu.errors import ConfigError, ModelFormatError, WeightFileError
from mnngpu.format import Net, Op, read_net
from mnngpu.runtime.moe import expert_subgraphs
from mnngpu.runtime.op_table import ALWAYS, OPS, SOURCES, WITHOUT_SECOND_INPUT, graph_op_types

# The graph inputs Llm feeds at every forward, and the output it reads.
FEEDS = ("input_ids", "attention_mask", "position_ids", "logits_index")
LOGITS = "logits"
# Fed as well when the config says so (Omni): {config key: graph input}
OPTIONAL_FEEDS = {"has_deepstack": "deepstack_embeds"}



def validate_model(config: LlmConfig, embedding: DiskEmbedding) -> Net:
    """Check the folder's graph against itself, the config and the embedding; returns the graph."""
    config.validate_backend()
    if config.get("has_deepstack") and not config.get("is_visual"):
        raise _config_error(config, "has_deepstack", "false for a model without vision (is_visual false): "
                                                     "deepstack rows come from the vision graph")
    net = read_net(config.model_path)
    check_graph(net, tuple(feed for key, feed in OPTIONAL_FEEDS.items() if config.get(key)))
    check_dimensions(net, config, embedding)
    return net


# ---- the graph on its own ----------------------------------------------------------------

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


def _check_interface(net: Net, extra_feeds: tuple[str, ...]) -> None:
    inputs = [op.name for op in net.ops if op.type == "Input"]
    fed = (*FEEDS, *extra_feeds)
    unknown = [name for name in inputs if name not in fed]
    if unknown:
        raise _error(net, f"graph inputs among {list(fed)} (what Llm feeds), got {unknown}", "Input ops")
    missing = [name for name in extra_feeds if name not in inputs]
    if missing:
        raise _error(net, f"the Input ops {missing} the config's {list(OPTIONAL_FEEDS)} ask for, got {inputs}",
                     "Input ops")
    if "input_ids" not in inputs:
        raise _error(net, f"an Input op named input_ids, got {inputs}", "Input ops")
    if LOGITS not in net.output_names:
        raise _error(net, f"an output named {LOGITS}, got {net.output_names}", "outputName")
    if LOGITS not in net.tensor_names:
        raise _error(net, f"a tensor named {LOGITS} (the declared output)", "tensorName")


# ---- the graph against the config and the embedding --------------------------------------

def check_dimensions(net: Net, config: LlmConfig, embedding: DiskEmbedding) -> None:
    """hidden_size, the vocab and layer_nums as the graph and the weights state them."""
    hidden = config.hidden_size
    input_ids = next(op for op in net.ops if op.type == "Input" and op.name == "input_ids")
    dims = input_ids.param.dims or []
    if dims and dims[-1] > 0 and dims[-1] != hidden:
        raise _config_error(config, "hidden_size", f"{dims[-1]}, the last dimension of the graph's input_ids "
                                                   f"in {net.path}, got {hidden}")
    lm_head = find_lm_head(net)
    if lm_head is not None:
        common = lm_head.param.common
        if common is not None and common.inputCount != hidden:
            raise _config_error(config, "hidden_size", f"{common.inputCount}, the input size of the lm_head "
                                                       f"'{lm_head.name}' in {net.path}, got {hidden}")
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
    attention = [op for op in net.ops if op.type == "Attention"]
    if not attention:
        return
    if config.layer_nums != len(attention):
        raise _config_error(config, "layer_nums", f"{len(attention)}, the Attention ops in {net.path}, "
                                                  f"got {config.layer_nums}")
    seen: set[int] = set()
    for op in attention:
        index = op.param.layer_index
        if index >= 0 and (index >= len(attention) or index in seen):
            raise ModelFormatError(f"a layer_index unique and in [0, {len(attention)}), got {index}",
                                   path=net.path, field=f"{op.name}.layer_index")
        seen.add(index)


# ---- messages ----------------------------------------------------------------------------

def _where(position: int, op: Op) -> str:
    return f"oplists[{position}] ({op.name or op.type})"


def _name(net: Net, tensor: int) -> str:
    return net.tensor_names[tensor] if 0 <= tensor < len(net.tensor_names) else "?"


def _error(net: Net, expected: str, where: str) -> ModelFormatError:
    return ModelFormatError(f"expected {expected}", path=net.path, field=where)


def _config_error(config: LlmConfig, key: str, expected: str) -> ConfigError:
    return ConfigError(f"expected {expected}", path=config.origin(key), field=key)
