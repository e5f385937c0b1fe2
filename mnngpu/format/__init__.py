"""Reading MNN model files: the llm.mnn graph, the llm.mnn.weight file, quantized weights.

    net = read_net("llm.mnn")                       # Net: ops, tensor_names, output_names, ...
    weights = WeightFile("llm.mnn.weight")          # read-only mmap, bounds-checked
    linear = read_linear(weights, op.param, op.name)   # QuantizedLinear: codes, scales, zeros, bias
    rows = read_quantized_rows(weights, QuantizedRows.from_tie_embeddings(tie, hidden), ids)
"""

from .net import Net, Op, SubGraph, parse_net, read_net
from .params import UnknownParam
from .quant import QuantizedLinear, read_linear
from .rows import QuantizedRows, read_quantized_rows
from .weights import WeightFile

__all__ = ["Net", "Op", "QuantizedLinear", "QuantizedRows", "SubGraph", "UnknownParam", "WeightFile", "parse_net",
           "read_linear", "read_net", "read_quantized_rows"]
