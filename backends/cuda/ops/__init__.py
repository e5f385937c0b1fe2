"""The CUDA backend's op table: op type -> Execution class, merged from each family file's
`EXECUTIONS` (a new op of a family touches only that family's file here). The MoE router's ops
have no kernels here yet: CUDABackend.caps says why they run on the CPU backup."""

from mnngpu.backend import merged_table
from mnngpu.backends.cuda.ops import attention, elementwise, linear, movement, norm, rope

FAMILIES = (movement, elementwise, linear, norm, rope, attention)
EXECUTIONS = merged_table(FAMILIES)
