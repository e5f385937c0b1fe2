"""The engine, mnngpu.engine: MNN's LLM flow in Python (mnngpu.llm is its public face). `Llm` is
one class made of parts, one concern a file:

    llm.py         Llm: the parts together, its constructor, the current context, create_lora
    loading.py     set_config, load, the tokenizer and chat-template properties, the LoRA base
    generation.py  tokens in and out, reset, generate, response
    forward.py     the forward: ids checks, prefill chunks, forward, verify and discard, hidden states
    feeds.py       the graph's inputs for a run (embedding rows, positions, masks) and placement
    sequences.py   several sequences: new_sequence, use_sequence, decode_rows
    prefix.py      the prefix cache (prefix_cache_path): cache_prefix and its reuse by generate
    context.py     LlmContext, one sequence's history and counts
"""

from mnngpu.engine.context import LlmContext
from mnngpu.engine.feeds import graph_feeds
from mnngpu.engine.forward import Logits
from mnngpu.engine.llm import Llm

__all__ = ["Llm", "LlmContext", "Logits", "graph_feeds"]
