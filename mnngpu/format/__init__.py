"""Reading MNN model files: the llm.mnn graph, the llm.mnn.weight file, quantized weights."""

from .net import Net, Op, SubGraph, parse_net, read_net
from .params import UnknownParam

__all__ = ["Net", "Op", "SubGraph", "UnknownParam", "parse_net", "read_net"]
