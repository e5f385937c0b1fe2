"""Multimodal models: Omni (model.py), an Llm that also reads images (vision.py) and audio (audio.py)."""

from mnngpu.omni.model import MEDIA_TAG, MropePositions, Omni, is_omni

__all__ = ["MEDIA_TAG", "MropePositions", "Omni", "is_omni"]
