"""The engine's ops, one file per op family: each lists its op types in `ROWS` (an OpType per
op: shape rule, host rule, parameter table, inputs, weight decoding) beside the helpers those
rules share, and the family's device-kernel limits where several backends read them.

mnngpu/ops/op_table.py merges the families into the one table the runtime reads; docs/ops.md is
the checklist for adding an op.
"""
