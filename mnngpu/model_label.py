"""The name a model goes by in what mnngpu prints and serves: its folder's name, except where the
folder's name says nothing about the model (the bundled demo's `model`, a Hub snapshot's commit hash)."""

from __future__ import annotations

from pathlib import Path

DEMO_LABEL = "mnngpu-demo"
HUB_REPO_PREFIX = "models--"   # huggingface_hub's cache: <cache>/models--ORG--NAME/snapshots/<commit>/


def model_label(folder: Path) -> str:
    """`mnngpu-demo`, `ORG/NAME` for a folder in huggingface_hub's cache, else the folder's name."""
    from mnngpu.demo import DEMO_MODEL_DIR

    folder = Path(folder).resolve()
    if folder == DEMO_MODEL_DIR:
        return DEMO_LABEL
    snapshots, repo = folder.parent, folder.parent.parent
    if snapshots.name == "snapshots" and repo.name.startswith(HUB_REPO_PREFIX):
        return repo.name[len(HUB_REPO_PREFIX):].replace("--", "/")   # repo ids hold no "--" (the Hub refuses it)
    return folder.name
