"""The bundled demo model: a small Qwen2 trained on generated text, exported in MNN's format.

`tools/train_demo_model.py` makes it; `docs/demo_model.md` says how and how good it is.
"""

from __future__ import annotations

from pathlib import Path

from mnngpu.errors import ConfigError

DEMO_MODEL_DIR = Path(__file__).resolve().parent / "model"


def demo_model_dir() -> Path:
    """The demo model's folder (config.json and the files it names)."""
    config = DEMO_MODEL_DIR / "config.json"
    if not config.is_file():
        raise ConfigError("the demo model's config.json is missing; reinstall mnngpu or run "
                          "python -m tools.train_demo_model in a checkout", path=config)
    return DEMO_MODEL_DIR
