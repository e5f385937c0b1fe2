"""Tokenizers of every format against their source libraries and MNN's own reader."""
