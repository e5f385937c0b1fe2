"""Fuzzing of the readers and the engine's inputs (targets in tools/fuzz_targets.py)."""
