"""The CUDA backend's op table: op type -> Execution class, merged from each family file's
`EXECUTIONS` (a new op of a family touches only that family's file here). The MoE router's ops
have no kernels here yet: CUDABackend.caps says why they run on the CPU backup."""

from mnngpu.backends.cuda.ops import attention, elementwise, linear, movement, norm

# The families in order: a later family's row replaces an earlier one's for the same op type.
FAMILIES = (movement, elementwise, linear, norm, attention)
EXECUTIONS = {op_type: execution for family in FAMILIES for op_type, execution in family.EXECUTIONS.items()}
