"""`mnngpu diff`: one prompt through two backends on the real model graph, compared op by op.

Each backend runs the prompt's prefill once, at the prompt's own length (no padding, so both run
the same shapes), with `keep_tensors` set so that no two tensors share memory; then every output
of every op that ran on a backend is read back. Outputs are matched by graph tensor, so the
backends' different fusions still line up (a fused node is compared on the pattern's result).
The error of an output is max |a - b| over max |a| (the first backend's scale); the first op
whose error is over the tolerance is where the backends part.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mnngpu.config import SET_CONFIG
from mnngpu.errors import InputError

DEFAULT_TOLERANCE = 1e-3   # the agreement asked of every backend at precision high


@dataclass
class OpOutput:
    tensor: int               # graph tensor id
    node: str
    op_type: str
    backend: str
    value: np.ndarray


@dataclass
class OpDiff:
    node: str
    op_type: str
    tensor: str               # the graph's name for the output
    shape: tuple[int, ...]
    backends: tuple[str, str]
    error: float              # max |a - b| / max |a|
    scale: float              # max |a|


def op_outputs(model, ids: list[int]) -> list[OpOutput]:
    """Every executed op's outputs for one prefill of `ids` on a model from load_for_diff."""
    from mnngpu.llm import graph_feeds

    model.reset()
    embeds = model.embedding.rows(ids).reshape(len(ids), 1, -1).astype(np.float32)
    session = model.pool.select(len(ids), False).session
    feeds = graph_feeds(embeds, 0, all_logits=False, mask=model.attention_mask,
                        positions=model._positions(0, len(ids), len(ids))) | model._extra_feeds(len(ids))
    meta = model.runtime.kv_meta
    meta.add = len(ids)
    session.run(feeds, ["logits"])
    meta.sync()
    pipeline, _ = session.resize(feeds)   # the pipeline that just ran (cached by shape)
    outputs = []
    for assignment in pipeline.assignments:
        if assignment.backend is None:
            continue   # folded on the host: the same numpy on both sides
        node = assignment.op.node
        for tensor_id, tensor in zip(assignment.op.outputs, assignment.outputs):
            holder = pipeline.backend_of(tensor)
            value = tensor.host if holder is None else holder.download(tensor)
            outputs.append(OpOutput(tensor_id, node.name, node.type, assignment.backend.type,
                                    np.asarray(value, dtype=np.float64)))
    return outputs


def compare(first: list[OpOutput], second: list[OpOutput], tensor_names: list[str]) -> list[OpDiff]:
    """The outputs both runs computed, in the first run's order, with their error."""
    by_tensor = {out.tensor: out for out in second}
    diffs = []
    for a in first:
        b = by_tensor.get(a.tensor)
        if b is None or a.value.shape != b.value.shape:
            continue
        scale = float(np.abs(a.value).max()) if a.value.size else 0.0
        gap = float(np.abs(a.value - b.value).max()) if a.value.size else 0.0
        error = gap / scale if scale > 0 else gap
        if not np.isfinite(error):
            error = float("inf")
        name = tensor_names[a.tensor] if 0 <= a.tensor < len(tensor_names) else str(a.tensor)
        diffs.append(OpDiff(a.node, a.op_type, name, a.value.shape, (a.backend, b.backend), error, scale))
    return diffs


def first_divergence(diffs: list[OpDiff], tolerance: float) -> OpDiff | None:
    return next((d for d in diffs if d.error > tolerance), None)


def load_for_diff(path, backend_type: str, overrides: dict, source: str = SET_CONFIG):
    from mnngpu import llm

    model = llm.create(path)
    model.config.set_config({"precision": "high", **overrides, "backend_type": backend_type}, source=source)
    model.load()
    model.runtime.schedule.backend_config.keep_tensors = True   # before the first resize
    return model


def diff_backends(path, backends: list[str], ids: list[int] | None = None, prompt: str = "",
                  overrides: dict | None = None, source: str = SET_CONFIG) -> tuple[list[int], list[OpDiff]]:
    """The per-op comparison of backends[0] against backends[1] on one prompt; warnings and errors
    about `overrides` name `source` (set_config(), or a command-line flag)."""
    if len(backends) != 2:
        raise InputError(f"expected two backends to compare, got {backends}", field="--backends")
    models = [load_for_diff(path, b, overrides or {}, source) for b in backends]
    if ids is None:
        ids = models[0].tokenizer_encode(prompt)
    if not ids:
        raise InputError("the prompt encodes to no tokens", field="--prompt")
    runs = [op_outputs(model, ids) for model in models]
    net = models[0].pool.select(len(ids), False).pipeline_module.static_module.net
    return ids, compare(runs[0], runs[1], net.tensor_names)


def format_diffs(diffs: list[OpDiff], tolerance: float) -> str:
    first = first_divergence(diffs, tolerance)
    width = max((len(d.node) for d in diffs), default=4)
    kinds = max((len(d.op_type) for d in diffs), default=4)
    lines = []
    for d in diffs:
        mark = "  <- first over tolerance" if d is first else ""
        lines.append(f"{d.node:<{width}}  {d.op_type:<{kinds}}  {d.tensor} {list(d.shape)}  "
                     f"error {d.error:.2e}{mark}")
    a, b = diffs[0].backends if diffs else ("?", "?")
    if first is None:
        lines.append(f"{a} and {b} agree on all {len(diffs)} op outputs within {tolerance:g}")
    else:
        lines.append(f"first op over {tolerance:g}: {first.node} ({first.op_type}), output {first.tensor}, "
                     f"error {first.error:.2e} ({a} vs {b})")
    return "\n".join(lines)
