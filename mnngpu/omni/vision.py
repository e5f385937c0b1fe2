"""Images for a vision model (Qwen2-VL style): reading, resizing, patching, and the vision module.

    image = read_image("cat.png")                        # uint8 RGB [h, w, 3], checked
    patches, grid = qwen2_patches(normalize(image, mean, norm))
    encoded = VisionEncoder(...).encode(image, (h, w))  # .rows [tokens, hidden], one per image_pad

The steps follow MNN's Omni (transformers/llm/engine/src/omni.cpp, version 3.6.1, the oracle's):
the target size is the configured image_size (or a prompt's <hw>h,w</hw>) rounded to a multiple of
patch_size * merge_size; MNN's bilinear resize (half-pixel centres, edge clamped, rounded to uint8);
(pixel - image_mean) * image_norm per RGB channel; the frame twice (temporal_patch_size 2) cut
into 14x14 patches (Qwen3-VL, Qwen3.5: 16x16) ordered by 2x2 merge blocks; each patch's (row, column)
for the rotary table; and for Qwen3-VL and Qwen3.5 each patch's four nearest cells of the learned
position table with their bilinear weights (Qwen3.5's tower is Qwen3-VL's without deepstack features). Decoding is Pillow's; nothing is fetched from a network.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import NamedTuple

import numpy as np

from mnngpu.errors import InputError, MnnGpuError, ModelFormatError

PATCH_SIZE = 14
QWEN3_PATCH_SIZE = 16
TEMPORAL_PATCH_SIZE = 2
MERGE_SIZE = 2
# Larger images are refused before they are decoded: a 5792x5792 RGB image is ~100 MB of pixels.
MAX_IMAGE_PIXELS = 5792 * 5792
# The vision graph's attention and masks take n x n floats for n patches: 4096 patches (an image
# resized to 896x896) bound them to 64 MB each.
MAX_PATCHES = 4096
SUPPORTED_MODES = ("RGB", "RGBA", "L", "LA", "P")   # 8-bit colour, grey and palette: all read as RGB


def is_url(text: str) -> bool:
    return text.strip().lower().startswith(("http://", "https://", "ftp://"))


def read_image(source: str | os.PathLike | bytes, name: str = "image") -> np.ndarray:
    """uint8 RGB pixels [h, w, 3] of an image file (or its bytes). One InputError, naming the
    file, for anything that is not one still 8-bit image of a sane size; the alpha channel is
    dropped (not blended), as MNN's imread does."""
    try:
        from PIL import Image, UnidentifiedImageError
    except ImportError:
        raise MnnGpuError("reading images needs Pillow: pip install 'mnngpu[vision]'") from None
    where = name if isinstance(source, bytes) else os.fspath(source)
    if not isinstance(source, bytes):
        if is_url(where):
            raise InputError("URLs are not fetched (the engine reads local files only); download the image "
                             "and pass its path, or a data: URL to the server", path=where, field=name)
        if not Path(where).is_file():
            raise InputError("no such image file", path=where, field=name)
    opened = io.BytesIO(source) if isinstance(source, bytes) else source
    try:
        with Image.open(opened) as image:
            _check_header(image, where, name)
            image.load()
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except InputError:
        raise
    except Image.DecompressionBombError as exc:   # Pillow's own limit, checked as it opens the file
        raise InputError(f"too large: {exc}; scale it down first", path=where, field=name) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise InputError(f"not a readable image ({type(exc).__name__}: {exc})", path=where, field=name) from None


def _check_header(image, where: str, name: str) -> None:
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise InputError(f"too large: {width}x{height} pixels, more than the {MAX_IMAGE_PIXELS} an image may have; "
                         "scale it down first", path=where, field=name)
    if getattr(image, "n_frames", 1) > 1:
        raise InputError(f"an animated image ({image.n_frames} frames); pass one still frame", path=where, field=name)
    if image.mode not in SUPPORTED_MODES:
        raise InputError(f"image mode {image.mode} is not supported; convert it to 8-bit RGB "
                         f"(supported: {', '.join(SUPPORTED_MODES)})", path=where, field=name)


def aligned_size(height: int, width: int, unit: int = PATCH_SIZE * MERGE_SIZE) -> tuple[int, int]:
    """MNN 3.6.1's Qwen2-VL target size: each side rounded to the nearest multiple of `unit`, at least one."""
    return max(unit, round(height / unit) * unit), max(unit, round(width / unit) * unit)


def resize_bilinear(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """MNN::CV::resize INTER_LINEAR on uint8 [h, w, c]: half-pixel centres, coordinates clamped to
    the edge, each sample rounded back to uint8."""
    ih, iw = image.shape[:2]
    ys = _sample_points(ih, height)
    xs = _sample_points(iw, width)
    y0, x0 = ys.astype(np.int64), xs.astype(np.int64)
    y1, x1 = np.ceil(ys).astype(np.int64), np.ceil(xs).astype(np.int64)
    fy, fx = (ys - y0)[:, None, None], (xs - x0)[None, :, None]
    pixels = image.astype(np.float32)
    top = (1 - fx) * pixels[y0][:, x0] + fx * pixels[y0][:, x1]
    bottom = (1 - fx) * pixels[y1][:, x0] + fx * pixels[y1][:, x1]
    value = np.clip((1 - fy) * top + fy * bottom, 0, 255)
    return np.floor(value + np.float32(0.5)).astype(np.uint8)   # roundf: half away from zero (value >= 0)


def _sample_points(source: int, target: int) -> np.ndarray:
    scale = np.float32(source / target)
    points = (np.arange(target, dtype=np.float32) + np.float32(0.5)) * scale - np.float32(0.5)
    return np.clip(points, 0, source - 1).astype(np.float32)


def normalize(image: np.ndarray, mean, norm) -> np.ndarray:
    """float32 [3, h, w]: (pixel - mean) * norm per RGB channel."""
    mean = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
    norm = np.asarray(norm, dtype=np.float32).reshape(3, 1, 1)
    return (image.transpose(2, 0, 1).astype(np.float32) - mean) * norm


def qwen2_patches(pixels: np.ndarray, patch: int = PATCH_SIZE) -> tuple[np.ndarray, tuple[int, int, int]]:
    """Normalized [3, h, w] -> patches [grid_h * grid_w, 3 * 2 * patch * patch] (the frame twice
    along time) in 2x2-merge-block order, and the grid (t, h, w) in patches."""
    channels, height, width = pixels.shape
    grid_h, grid_w = height // patch, width // patch
    frames = np.stack([pixels] * TEMPORAL_PATCH_SIZE)                      # (t, c, h, w)
    blocks = frames.reshape(1, TEMPORAL_PATCH_SIZE, channels, grid_h // MERGE_SIZE, MERGE_SIZE, patch,
                            grid_w // MERGE_SIZE, MERGE_SIZE, patch)
    blocks = blocks.transpose(0, 3, 6, 4, 7, 2, 1, 5, 8)
    patches = blocks.reshape(grid_h * grid_w, channels * TEMPORAL_PATCH_SIZE * patch * patch)
    return np.ascontiguousarray(patches, dtype=np.float32), (1, grid_h, grid_w)


def merge_block_order(grid: np.ndarray) -> np.ndarray:
    """[..., grid_h, grid_w] -> [..., grid_h * grid_w] in the patches' 2x2-merge-block order."""
    *lead, grid_h, grid_w = grid.shape
    shaped = grid.reshape(*lead, grid_h // MERGE_SIZE, MERGE_SIZE, grid_w // MERGE_SIZE, MERGE_SIZE)
    axes = len(lead)
    shaped = shaped.transpose(*range(axes), axes, axes + 2, axes + 1, axes + 3)
    return np.ascontiguousarray(shaped.reshape(*lead, grid_h * grid_w))


def patch_positions(grid_h: int, grid_w: int) -> np.ndarray:
    """int32 [2, grid_h * grid_w]: each patch's (row, column), in the patches' merge-block order."""
    rows, cols = np.meshgrid(np.arange(grid_h), np.arange(grid_w), indexing="ij")
    return merge_block_order(np.stack([rows, cols])).astype(np.int32)


def position_table_lookup(num_grid: int, grid_h: int, grid_w: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL's idx_tensor int32 [4, n] and weight_tensor float32 [4, n]: the learned
    num_grid x num_grid position table stretched over the patch grid (corner to corner), each
    patch reading its four nearest cells (top-left, top-right, bottom-left, bottom-right) with
    bilinear weights, in merge-block order. float32 arithmetic, as MNN's Omni computes it."""
    def axis(count: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        points = np.arange(count, dtype=np.float32) * np.float32(num_grid - 1) / np.float32(count - 1)
        low = points.astype(np.int64)
        return low, np.minimum(low + 1, num_grid - 1), (points - low).astype(np.float32)

    (top, bottom, dh), (left, right, dw) = axis(grid_h), axis(grid_w)
    dh, dw, one = dh[:, None], dw[None, :], np.float32(1)
    index = np.stack([top[:, None] * num_grid + left, top[:, None] * num_grid + right,
                      bottom[:, None] * num_grid + left, bottom[:, None] * num_grid + right])
    weight = np.stack([(one - dh) * (one - dw), (one - dh) * dw, dh * (one - dw), dh * dw])
    return merge_block_order(index).astype(np.int32), merge_block_order(weight).astype(np.float32)


WINDOW = 4   # Qwen2.5-VL: merged tokens per window side (window_size 112 / patch 14 / merge 2), as MNN fixes it


def window_layout(grid_h: int, grid_w: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's windows: int32 [tokens] the merged tokens' order window by window (row-major
    windows of WINDOW x WINDOW tokens, cut at the grid's edge), and float32 [2, 1, n, n] masks over
    the n patches: full attention, and attention within each window only."""
    rows, cols = grid_h // MERGE_SIZE, grid_w // MERGE_SIZE
    order, sizes = [], []
    for top in range(0, rows + WINDOW - rows % WINDOW, WINDOW):
        for left in range(0, cols + WINDOW - cols % WINDOW, WINDOW):
            window = [r * cols + c for r in range(top, min(top + WINDOW, rows)) for c in range(left, min(left + WINDOW, cols))]
            order += window
            sizes.append(len(window) * MERGE_SIZE * MERGE_SIZE)
    patches = grid_h * grid_w
    masks = np.zeros((2, 1, patches, patches), dtype=np.float32)
    masks[1] = np.finfo(np.float32).min
    start = 0
    for size in sizes:
        masks[1, 0, start: start + size, start: start + size] = 0
        start += size
    return np.array(order, dtype=np.int32), masks


class EncodedImage(NamedTuple):
    rows: np.ndarray                 # float32 [tokens, hidden], one row per image_pad
    grid: tuple[int, int]            # the merged grid (rows, columns)
    deepstack: np.ndarray | None     # Qwen3-VL: float32 [layers, tokens, hidden], added after the first layers
                                     # (None for a tower without deepstack mergers: Qwen3.5's)


class VisionEncoder:
    """visual.mnn (+ visual.mnn.weight) run through the engine's runtime, and its preprocessing."""

    INPUTS = ("patches", "position_ids", "attention_mask")
    WINDOWED = (*INPUTS, "window_index")   # Qwen2.5-VL
    POSITION_TABLE = (*INPUTS, "idx_tensor", "weight_tensor")   # Qwen3-VL, Qwen3.5
    OUTPUTS = ("image_embeds",)
    DEEPSTACK_OUTPUTS = ("image_embeds", "deepstack_feature")    # Qwen3-VL; Qwen3.5's tower has no deepstack

    def __init__(self, module, hidden_size: int, mean, norm, model_path: Path, num_grid_per_side=None):
        names = tuple(module.input_names)
        if names not in (self.INPUTS, self.WINDOWED, self.POSITION_TABLE):
            raise ModelFormatError(f"a Qwen2-VL, Qwen2.5-VL, Qwen3-VL or Qwen3.5 vision graph (inputs "
                                   f"{list(self.INPUTS)}, or with window_index, or with idx_tensor and weight_tensor), "
                                   f"got {list(names)}: other vision encoders are not implemented", path=model_path,
                                   field="inputs")
        self.has_deepstack = self._has_deepstack(tuple(module.pipeline_module.output_names), names, model_path)
        self.windowed = names == self.WINDOWED
        self.num_grid = None
        if names == self.POSITION_TABLE:
            if not isinstance(num_grid_per_side, int) or num_grid_per_side < 2:
                raise ModelFormatError(f"a Qwen3-VL or Qwen3.5 vision graph needs num_grid_per_side (an integer "
                                       f">= 2) in llm_config.json, got {num_grid_per_side!r}", path=model_path,
                                       field="num_grid_per_side")
            self.num_grid = num_grid_per_side
        self.patch = QWEN3_PATCH_SIZE if self.num_grid else PATCH_SIZE
        self.module = module
        self.hidden_size = hidden_size
        self.mean, self.norm = mean, norm

    def _has_deepstack(self, outputs: tuple[str, ...], inputs: tuple[str, ...], model_path: Path) -> bool:
        """Whether the graph also gives deepstack features: only a position-table graph may (Qwen3-VL's)."""
        allowed = (self.OUTPUTS, self.DEEPSTACK_OUTPUTS) if inputs == self.POSITION_TABLE else (self.OUTPUTS,)
        if set(outputs) not in [set(names) for names in allowed]:   # the graph's order is the exporter's
            raise ModelFormatError(f"a vision graph with outputs {' or '.join(str(list(o)) for o in allowed)}, got "
                                   f"{list(outputs)}", path=model_path, field="outputName")
        return set(outputs) == set(self.DEEPSTACK_OUTPUTS)

    def align(self, height: int, width: int) -> tuple[int, int]:
        """A requested size rounded as MNN 3.6.1 rounds it for this graph's patch size."""
        return aligned_size(height, width, self.patch * MERGE_SIZE)

    def encode(self, image: np.ndarray, size: tuple[int, int]) -> EncodedImage:
        """The image resized to `size` (already aligned) through the vision graph."""
        height, width = size
        count = (height // self.patch) * (width // self.patch)
        if count > MAX_PATCHES:
            raise InputError(f"resizing to {height}x{width} makes {count} patches, more than the {MAX_PATCHES} "
                             "the vision graph may take; choose a smaller <hw> or image_size", field="image_size")
        resized = image if image.shape[:2] == (height, width) else resize_bilinear(image, height, width)
        patches, (_, grid_h, grid_w) = qwen2_patches(normalize(resized, self.mean, self.norm), self.patch)
        feeds = {"patches": patches, "position_ids": patch_positions(grid_h, grid_w),
                 "attention_mask": np.zeros((1, count, count), dtype=np.float32)}
        if self.windowed:
            feeds["window_index"], feeds["attention_mask"] = window_layout(grid_h, grid_w)
        if self.num_grid:
            feeds["idx_tensor"], feeds["weight_tensor"] = position_table_lookup(self.num_grid, grid_h, grid_w)
        wanted = self.DEEPSTACK_OUTPUTS if self.has_deepstack else self.OUTPUTS
        outputs = self.module.forward(feeds, list(wanted))
        embeds = np.asarray(outputs[0], dtype=np.float32).reshape(-1, self.hidden_size)
        deepstack = None
        if self.has_deepstack:
            deepstack = np.asarray(outputs[1], dtype=np.float32).reshape(-1, embeds.shape[0], self.hidden_size)
        return EncodedImage(embeds, (grid_h // MERGE_SIZE, grid_w // MERGE_SIZE), deepstack)
