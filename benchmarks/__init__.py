"""Benchmarks, run from the repository root as modules (`python -m benchmarks.compare_mnn MODEL`).

Not installed with mnngpu; benchmarks/README.md says what each one measures.
"""
