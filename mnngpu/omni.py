"""Omni: an Llm that also reads images in its prompts (MNN's Omni, chosen by the same config test).

    llm = create("qwen2-vl/config.json")          # is_visual, is_audio or has_talker -> Omni
    llm.load()                                     # the LLM, then visual.mnn on the mllm runtime
    ids = llm.tokenizer_encode("<img>cat.png</img>What is it?")
    logits = llm.forward(ids)                      # image rows and mrope positions put in

A prompt names an image as `<img>PATH</img>`, optionally sized `<img><hw>H,W</hw>PATH</img>`
(else the config's image_size on both sides). Each image becomes vision_start, one image_pad per
vision token and vision_end; its rows replace the image_pad rows at the next forward of those ids,
whose positions are MNN's mrope positions (text: one index on all three axes; an image: time,
row and column of its merged grid). A Qwen3-VL graph also takes deepstack_embeds [3, seq, hidden]:
the vision graph's deepstack features at an image's rows, zeros elsewhere and on decode steps.
Audio (`<audio>`) and speech output are not implemented.
"""

from __future__ import annotations

import copy
import re
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from mnngpu.config import LlmConfig
from mnngpu.errors import ConfigError, InputError, ModelFormatError
from mnngpu.llm import Llm
from mnngpu.runtime.module import Module, ModuleConfig
from mnngpu.runtime.schedule import RuntimeManager
from mnngpu.vision import MERGE_SIZE, PATCH_SIZE, EncodedImage, VisionEncoder, aligned_size, read_image

MEDIA_TAG = re.compile(r"<(img|audio)>(.*?)</\1>")
SIZE_TAG = re.compile(r"<hw>(.*?)</hw>")
# deepstack_embeds rows the exporter traces Qwen3-VL's LLM graph with (and MNN feeds as zeros on decode)
DEEPSTACK_LAYERS = 3
# the keys of config "mllm" that choose the vision module's runtime, as MNN's
MLLM_RUNTIME_KEYS = ("backend_type", "thread_num", "precision", "power", "memory")


def is_omni(config: LlmConfig) -> bool:
    """MNN's test: a model with vision, audio or a talker is an Omni."""
    return bool(config.get("is_visual") or config.get("is_audio") or config.get("has_talker"))


@dataclass
class MropePositions:
    """A prompt's positions on the three mrope axes (time, height, width), from 0."""

    t: list[int] = field(default_factory=list)
    h: list[int] = field(default_factory=list)
    w: list[int] = field(default_factory=list)

    def next_index(self) -> int:
        # MNN continues after the last width index, not after the largest index
        return self.w[-1] + 1 if self.w else 0

    def add(self, t: int, h: int, w: int) -> None:
        self.t.append(t)
        self.h.append(h)
        self.w.append(w)

    def add_text(self, count: int) -> None:
        start = self.next_index()
        for index in range(start, start + count):
            self.add(index, index, index)

    def add_image(self, grid_h: int, grid_w: int) -> None:
        """vision_start, the merged grid's (0, row, column) offsets, vision_end."""
        self.add_text(1)
        base = self.next_index()
        for row in range(grid_h):
            for col in range(grid_w):
                self.add(base, base + row, base + col)
        self.add_text(1)

    def array(self) -> np.ndarray:
        return np.array([self.t, self.h, self.w], dtype=np.int32)


@dataclass
class EncodedPrompt:
    ids: list[int]
    positions: np.ndarray        # int32 [3, len(ids)], from 0
    images: list[EncodedImage]   # in prompt order


class Omni(Llm):
    def __init__(self, config: LlmConfig):
        super().__init__(config)
        self.vision: VisionEncoder | None = None
        self._encoded: EncodedPrompt | None = None     # the last tokenizer_encode with media
        self._image_rows: list[np.ndarray] = []        # rows waiting for their image_pad ids
        self._deepstack_rows: list[np.ndarray] = []    # Qwen3-VL: each [layers, hidden], beside them
        self._deepstack: np.ndarray | None = None      # the next graph run's deepstack_embeds rows
        self._forward_positions: np.ndarray | None = None
        self._sources: dict[str, bytes] = {}   # media_sources(): <img>NAME</img> -> encoded image bytes
        self._read_files = True

    # ---- loading --------------------------------------------------------------------------------
    def load(self, progress=None) -> None:
        super().load(progress)
        cfg = self.config   # has_talker: the config's one warning line says speech output is not supported
        if cfg.get("is_visual"):
            self.vision = self._load_vision()

    def _load_vision(self) -> VisionEncoder:
        cfg = self.config
        model_path = cfg.base_dir / cfg.get("visual_model", "visual.mnn")
        if not model_path.is_file():
            raise ConfigError(f"is_visual is true but the vision graph {model_path.name} is missing",
                              path=model_path, field="visual_model")
        runtime = self._processor_runtime()
        module_config = ModuleConfig(shape_mutable=True, rearrange=True)
        module = Module.load(model_path, model_path.with_name(model_path.name + ".weight"), module_config, runtime)
        return VisionEncoder(module, cfg.hidden_size, cfg.get("image_mean"), cfg.get("image_norm"), model_path,
                             cfg.get("num_grid_per_side"))

    def _processor_runtime(self) -> RuntimeManager:
        """MNN's processor runtime: the config's mllm settings when it has them, else the LLM's own."""
        mllm = self.config.get("mllm")
        if not mllm:
            return self.runtime
        if not isinstance(mllm, dict):
            raise ConfigError(f"an object of runtime settings, got {mllm!r}", path=self.config.origin("mllm"),
                              field="mllm")
        vision_config = copy.deepcopy(self.config)
        vision_config.set_config({key: mllm[key] for key in MLLM_RUNTIME_KEYS if key in mllm})
        runtime = RuntimeManager.from_config(vision_config)
        runtime.kv_meta.attn_scale = 0.0   # the LLM's attn_scale is not the vision graph's
        return runtime

    # ---- prompts --------------------------------------------------------------------------------
    @contextmanager
    def media_sources(self, images: dict[str, bytes]):
        """While inside, <img>NAME</img> reads the bytes `images` holds under NAME, and no other
        name is read as a file (the server's data: URLs: a client names no file of this machine)."""
        saved = self._sources, self._read_files
        self._sources, self._read_files = dict(images), False
        try:
            yield
        finally:
            self._sources, self._read_files = saved

    def count_prompt_tokens(self, text: str) -> int:
        """len(tokenizer_encode(text)) without decoding or encoding an image: each takes two
        markers and one token per merged block (28x28; Qwen3-VL 32x32) of the size it is resized to."""
        count, cursor = 0, 0
        unit = self.vision.patch * MERGE_SIZE if self.vision else PATCH_SIZE * MERGE_SIZE
        for match in MEDIA_TAG.finditer(text):
            count += len(self.tokenizer.encode(text[cursor: match.start()]))
            height, width = self._align(self._image_size(match.group(2))[0])
            count += 2 + (height // unit) * (width // unit)
            cursor = match.end()
        return count + len(self.tokenizer.encode(text[cursor:]))

    def tokenizer_encode(self, text: str) -> list[int]:
        """Ids of a prompt with <img>…</img> parts; plain text encodes as Llm's does."""
        if not MEDIA_TAG.search(text):
            return super().tokenizer_encode(text)   # a pending image prompt stays pending
        ids: list[int] = []
        positions = MropePositions()
        images: list[EncodedImage] = []
        cursor = 0
        for match in MEDIA_TAG.finditer(text):
            piece = self.tokenizer.encode(text[cursor: match.start()])
            ids += piece
            positions.add_text(len(piece))
            if match.group(1) == "audio":
                raise InputError("this engine does not implement audio input (<audio> parts)", field="prompt")
            image = self._encode_image(match.group(2))
            ids += [self._token("vision_start")] + [self._token("image_pad")] * image.rows.shape[0] + \
                [self._token("vision_end")]
            positions.add_image(*image.grid)
            images.append(image)
            cursor = match.end()
        piece = self.tokenizer.encode(text[cursor:])
        ids += piece
        positions.add_text(len(piece))
        self._encoded = EncodedPrompt(ids, positions.array(), images)
        return list(ids)

    def _token(self, key: str) -> int:
        value = self.config.get(key)
        if not isinstance(value, int):
            raise ConfigError(f"the id of the {key} token, got {value!r}", path=self.config.origin(key), field=key)
        return value

    def _encode_image(self, content: str) -> EncodedImage:
        if self.vision is None:
            if not self._loaded:
                raise InputError("call load() before encoding a prompt with an image", field="prompt")
            raise InputError("this model has no vision module (is_visual is false); it cannot read <img>",
                             field="prompt")
        size, source = self._image_size(content)
        if source in self._sources:
            image = read_image(self._sources[source], name=source)
        elif not self._read_files:
            raise InputError("images come as image_url data: URLs here; <img> names no file", field="prompt")
        else:
            image = read_image(source)
        return self.vision.encode(image, self._align(size))

    def _align(self, size: tuple[int, int]) -> tuple[int, int]:
        return self.vision.align(*size) if self.vision else aligned_size(*size)

    def _image_size(self, content: str) -> tuple[tuple[int, int], str]:
        """((height, width) before alignment, the image's name) of an <img> part: <hw>H,W</hw> or
        the config's image_size on both sides, as MNN 3.6.1's Omni."""
        size = self.config.get("image_size", 420)
        sized = SIZE_TAG.search(content)
        if not sized:
            return (size, size), content.strip()
        return _parse_size(sized.group(1)), (content[: sized.start()] + content[sized.end():]).strip()

    # ---- the forward pass -----------------------------------------------------------------------
    def forward(self, ids):
        """As Llm's; when `ids` are the last image prompt's ids, or their end while the cache holds
        the start (a prefix cache), its image rows and mrope positions go in with them."""
        encoded, ids = self._encoded, [int(i) for i in np.asarray(ids).reshape(-1)]
        offset = len(encoded.ids) - len(ids) if encoded is not None else -1
        if offset >= 0 and encoded.ids[offset:] == ids and self.runtime.kv_meta.kept >= offset:
            self._forward_positions = encoded.positions[:, offset:] + (self.runtime.kv_meta.kept - offset)
            skipped = sum(token == self.config.get("image_pad") for token in encoded.ids[:offset])
            self._image_rows = [row for image in encoded.images for row in image.rows][skipped:]
            self._deepstack_rows = [row for image in encoded.images if image.deepstack is not None
                                    for row in image.deepstack.transpose(1, 0, 2)][skipped:]
            self._encoded = None   # its images enter the cache once
        try:
            return super().forward(ids)
        finally:
            self._forward_positions = None
            self._image_rows, self._deepstack_rows = [], []

    def _embed(self, ids: list[int]) -> np.ndarray:
        self._deepstack = None
        rows = super()._embed(ids)
        pad = self.config.get("image_pad")
        slots = [i for i, token in enumerate(ids) if token == pad]
        if not slots or (len(ids) == 1 and not self._image_rows):
            return rows   # as MNN: one id is a text row, even a generated image_pad
        if len(slots) > len(self._image_rows):
            raise InputError("image_pad tokens with no image: put images in a prompt as <img>PATH</img> and "
                             "forward the ids tokenizer_encode returned", field="input_ids")
        rows = np.array(rows, dtype=np.float32)
        if self._deepstack_rows:
            self._deepstack = np.zeros((self._deepstack_rows[0].shape[0], len(ids), rows.shape[1]), np.float32)
        for slot in slots:
            rows[slot] = self._image_rows.pop(0)
            if self._deepstack is not None:
                self._deepstack[:, slot] = self._deepstack_rows.pop(0)
        return rows

    def _extra_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """deepstack_embeds [layers, rows, hidden] for a Qwen3-VL graph: the image rows' features
        the last _embed put in, zeros elsewhere (text, decode steps, a fixed-shape chunk's pad)."""
        if not self.config.get("has_deepstack"):
            return {}
        layers = DEEPSTACK_LAYERS if self._deepstack is None else self._deepstack.shape[0]
        feed = np.zeros((layers, rows, self.config.hidden_size), dtype=np.float32)
        if self._deepstack is not None:
            feed[:, : self._deepstack.shape[1]] = self._deepstack
        self._deepstack = None
        return {"deepstack_embeds": feed}

    def _positions(self, first: int, seq: int, rows: int) -> np.ndarray:
        if self._forward_positions is None:
            return super()._positions(first, seq, rows)
        if self.position_axes != 3:
            raise ModelFormatError("an mrope graph (position_ids [3, seq]) for a prompt with an image",
                                   path=self.config.model_path, field="position_ids")
        taken, self._forward_positions = self._forward_positions[:, :seq], self._forward_positions[:, seq:]
        padding = taken[:, -1:] + 1 + np.arange(rows - seq, dtype=np.int32)   # a fixed-shape chunk's pad rows
        return np.concatenate([taken, padding], axis=1).astype(np.int32)


def _parse_size(text: str) -> tuple[int, int]:
    parts = text.split(",")
    try:
        height, width = (int(part) for part in parts)
    except ValueError:
        raise InputError(f"<hw>HEIGHT,WIDTH</hw> with two positive integers, got <hw>{text}</hw>",
                         field="prompt") from None
    if height <= 0 or width <= 0:
        raise InputError(f"<hw> with positive sizes, got {height},{width}", field="prompt")
    return height, width


__all__ = ["MropePositions", "Omni", "is_omni"]
