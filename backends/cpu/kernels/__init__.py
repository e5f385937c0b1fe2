"""The numba kernels that several CPU executions share: LLVM intrinsics (prefetch, int16 dot
products), fast float math, and the GEMV families of the linear layer. An op's own kernels sit
beside its Execution in ops/<family>.py."""
