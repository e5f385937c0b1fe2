"""Tools for developers, run from the repository root as modules (`python -m tools.make_fixtures`).

Not installed with mnngpu: they make the test fixtures, the demo and bench models, and the shaders.
"""
