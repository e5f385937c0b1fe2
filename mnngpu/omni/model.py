"""Omni: an Llm that also reads images and audio in its prompts (MNN's Omni, chosen by the same config test).

    llm = create("qwen2-vl/config.json")          # is_visual, is_audio or has_talker -> Omni
    llm.load()                                     # the LLM, then visual.mnn / audio.mnn on the mllm runtime
    ids = llm.tokenizer_encode("<img>cat.png</img>What is it?")
    logits = llm.forward(ids)                      # image rows and mrope positions put in

A prompt names an image as `<img>PATH</img>`, optionally sized `<img><hw>H,W</hw>PATH</img>`
(else the config's image_size on both sides). Each image becomes vision_start, one image_pad per
vision token and vision_end; its rows replace the image_pad rows at the next forward of those ids,
whose positions are MNN's mrope positions (text: one index on all three axes; an image: time,
row and column of its merged grid). A Qwen3-VL graph also takes deepstack_embeds [3, seq, hidden]:
the vision graph's deepstack features at an image's rows, zeros elsewhere and on decode steps.
Qwen3.5's graphs (a Qwen3-VL tower without deepstack, a hybrid Gated-DeltaNet LLM) take none.
A prompt names a WAV file as `<audio>PATH</audio>`: it becomes audio_start (when the config has
one), one audio_pad per audio token and audio_end (likewise), its rows taking the audio_pad rows
and text positions. Speech output is not implemented.
"""

from __future__ import annotations

import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mnngpu.config import LlmConfig
from mnngpu.engine import Llm
from mnngpu.errors import ConfigError, InputError, ModelFormatError
from mnngpu.omni.audio import HOP, AudioEncoder, audio_tokens, read_wav
from mnngpu.omni.vision import MERGE_SIZE, PATCH_SIZE, EncodedImage, VisionEncoder, aligned_size, read_image
from mnngpu.runtime.module import Module, ModuleConfig
from mnngpu.runtime.schedule import RuntimeManager

MEDIA_TAG = re.compile(r"<(img|audio)>(.*?)</\1>")
SIZE_TAG = re.compile(r"<hw>(.*?)</hw>")
# deepstack_embeds rows the exporter traces Qwen3-VL's LLM graph with (and MNN feeds as zeros on decode)
DEEPSTACK_LAYERS = 3
NO_AUDIO = "audio module (is_audio is false); it cannot read <audio>"
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
    audios: list[np.ndarray]     # each [tokens, hidden], in prompt order


class Omni(Llm):
    def __init__(self, config: LlmConfig):
        super().__init__(config)
        self.vision: VisionEncoder | None = None
        self.audio: AudioEncoder | None = None
        self._encoded: EncodedPrompt | None = None     # the last tokenizer_encode with media
        self._media_rows: dict[int, list[np.ndarray]] = {}   # pad id -> rows waiting for its ids
        self._deepstack_rows: list[np.ndarray] = []    # Qwen3-VL: each [layers, hidden], beside the image rows
        self._deepstack: np.ndarray | None = None      # the next graph run's deepstack_embeds rows
        self._forward_positions: np.ndarray | None = None
        self._sources: dict[str, bytes] = {}   # media_sources(): <img>NAME</img> or <audio>NAME</audio> -> bytes
        self._read_files = True

    # ---- loading --------------------------------------------------------------------------------
    def load(self, progress=None) -> None:
        super().load(progress)
        cfg = self.config   # has_talker: the config's one warning line says speech output is not supported
        runtime = self._processor_runtime() if cfg.get("is_visual") or cfg.get("is_audio") else None
        if cfg.get("is_visual"):
            model_path, module = self._load_module("is_visual", "visual_model", "visual.mnn", runtime)
            self.vision = VisionEncoder(module, cfg.hidden_size, cfg.get("image_mean"), cfg.get("image_norm"),
                                        model_path, cfg.get("num_grid_per_side"))
            self._check_deepstack_pairing(model_path)
        if cfg.get("is_audio"):
            model_path, module = self._load_module("is_audio", "audio_model", "audio.mnn", runtime)
            self.audio = AudioEncoder(module, cfg.hidden_size, model_path)

    def _check_deepstack_pairing(self, vision_path: Path) -> None:
        """The LLM graph takes deepstack_embeds exactly when the vision graph makes deepstack features
        (Qwen3-VL: both; Qwen3.5: neither, whatever its has_deepstack says)."""
        takes = "deepstack_embeds" in self.graph_inputs
        if takes != self.vision.has_deepstack:
            have, lack = (("the LLM graph takes deepstack_embeds", "the vision graph has no deepstack_feature output")
                          if takes else ("the vision graph has a deepstack_feature output",
                                         "the LLM graph takes no deepstack_embeds"))
            raise ModelFormatError(f"{have} but {lack}: the two graphs come from different exports",
                                   path=vision_path, field="deepstack_feature")

    def _load_module(self, flag: str, key: str, default: str, runtime: RuntimeManager):
        """(path, module) of a processor graph (visual.mnn, audio.mnn) on the processor runtime."""
        model_path = self.config.base_dir / self.config.get(key, default)
        if not model_path.is_file():
            raise ConfigError(f"{flag} is true but the graph {model_path.name} is missing", path=model_path,
                              field=key)
        module_config = ModuleConfig(shape_mutable=True, rearrange=True)
        weight_path = model_path.with_name(model_path.name + ".weight")
        return model_path, Module.load(model_path, weight_path, module_config, runtime)

    def _processor_runtime(self) -> RuntimeManager:
        """MNN's processor runtime: the config's mllm settings when it has them, else the LLM's own."""
        mllm = self.config.get("mllm")
        if not mllm:
            return self.runtime
        if not isinstance(mllm, dict):
            raise ConfigError(f"an object of runtime settings, got {mllm!r}", path=self.config.origin("mllm"),
                              field="mllm")
        runtime = RuntimeManager.from_config(self.config.section_config("mllm", MLLM_RUNTIME_KEYS))
        runtime.kv_meta.attn_scale = 0.0   # the LLM's attn_scale is not the vision graph's
        return runtime

    # ---- prompts --------------------------------------------------------------------------------
    @contextmanager
    def media_sources(self, media: dict[str, bytes]):
        """While inside, <img>NAME</img> and <audio>NAME</audio> read the bytes `media` holds under
        NAME, and no other name is read as a file (the server's data: URLs and input_audio parts:
        a client names no file of this machine)."""
        saved = self._sources, self._read_files
        self._sources, self._read_files = dict(media), False
        try:
            yield
        finally:
            self._sources, self._read_files = saved

    def count_prompt_tokens(self, text: str, media: dict[str, bytes] | None = None) -> int:
        """len(tokenizer_encode(text)) without running a vision or audio graph: an image takes two
        markers and one token per merged block (28x28; Qwen3-VL 32x32) of the size it is resized
        to; a clip its markers and one token per four mel frames (the WAV is read, no feature is
        computed). `media`: as media_sources() would give, for this count only."""
        count, cursor = 0, 0
        unit = self.vision.patch * MERGE_SIZE if self.vision else PATCH_SIZE * MERGE_SIZE
        for match in MEDIA_TAG.finditer(text):
            count += len(self.tokenizer.encode(text[cursor: match.start()]))
            if match.group(1) == "audio":
                self._require(self.audio, NO_AUDIO)
                samples = self._read_audio(match.group(2), media).size
                count += sum(map(len, self._audio_markers())) + audio_tokens(samples // HOP)
            else:
                height, width = self._align(self._image_size(match.group(2))[0])
                count += 2 + (height // unit) * (width // unit)
            cursor = match.end()
        return count + len(self.tokenizer.encode(text[cursor:]))

    def tokenizer_encode(self, text: str) -> list[int]:
        """Ids of a prompt with <img>…</img> and <audio>…</audio> parts; plain text encodes as Llm's does."""
        if not MEDIA_TAG.search(text):
            return super().tokenizer_encode(text)   # a pending media prompt stays pending
        ids: list[int] = []
        positions = MropePositions()
        encoded = EncodedPrompt(ids, np.zeros((3, 0), np.int32), [], [])
        cursor = 0
        for match in MEDIA_TAG.finditer(text):
            piece = self.tokenizer.encode(text[cursor: match.start()])
            ids += piece
            positions.add_text(len(piece))
            if match.group(1) == "audio":
                rows = self._encode_audio(match.group(2))
                start, end = self._audio_markers()
                ids += start + [self._token("audio_pad")] * rows.shape[0] + end
                positions.add_text(len(start) + rows.shape[0] + len(end))
                encoded.audios.append(rows)
            else:
                image = self._encode_image(match.group(2))
                ids += [self._token("vision_start")] + [self._token("image_pad")] * image.rows.shape[0] + \
                    [self._token("vision_end")]
                positions.add_image(*image.grid)
                encoded.images.append(image)
            cursor = match.end()
        piece = self.tokenizer.encode(text[cursor:])
        ids += piece
        positions.add_text(len(piece))
        encoded.positions = positions.array()
        self._encoded = encoded
        return list(ids)

    def _token(self, key: str) -> int:
        value = self.config.get(key)
        if not isinstance(value, int):
            raise ConfigError(f"the id of the {key} token, got {value!r}", path=self.config.origin(key), field=key)
        return value

    def _audio_markers(self) -> tuple[list[int], list[int]]:
        """([audio_start], [audio_end]), each empty when the config has none (a negative id), as MNN."""
        marks = (self.config.get("audio_start", -1), self.config.get("audio_end", -1))
        return tuple([mark] if isinstance(mark, int) and mark >= 0 else [] for mark in marks)

    def _media_bytes(self, source: str, part: str, media: dict[str, bytes] | None = None) -> bytes | None:
        """The bytes media_sources() (or `media`) holds for a part's name, else None (read the file)."""
        sources, read_files = (self._sources, self._read_files) if media is None else (media, False)
        if source in sources:
            return sources[source]
        if not read_files:
            raise InputError(f"media come as data here (image_url data: URLs, input_audio); <{part}> names no file",
                             field="prompt")
        return None

    def _encode_image(self, content: str) -> EncodedImage:
        self._require(self.vision, "vision module (is_visual is false); it cannot read <img>")
        size, source = self._image_size(content)
        data = self._media_bytes(source, "img")
        image = read_image(source) if data is None else read_image(data, name=source)
        return self.vision.encode(image, self._align(size))

    def _align(self, size: tuple[int, int]) -> tuple[int, int]:
        return self.vision.align(*size) if self.vision else aligned_size(*size)

    def _read_audio(self, content: str, media: dict[str, bytes] | None = None) -> np.ndarray:
        source = content.strip()
        data = self._media_bytes(source, "audio", media)
        return read_wav(source) if data is None else read_wav(data, name=source)

    def _encode_audio(self, content: str) -> np.ndarray:
        self._require(self.audio, NO_AUDIO)
        return self.audio.encode(self._read_audio(content))

    def _require(self, module, missing: str) -> None:
        if module is None:
            if not self._loaded:
                raise InputError("call load() before encoding a prompt with an image or audio", field="prompt")
            raise InputError(f"this model has no {missing}", field="prompt")

    def _image_size(self, content: str) -> tuple[tuple[int, int], str]:
        """((height, width) before alignment, the image's name) of an <img> part: <hw>H,W</hw> or
        the config's image_size on both sides, as MNN 3.6.1's Omni."""
        size = self.config.get("image_size", 420)
        sized = SIZE_TAG.search(content)
        if not sized:
            return (size, size), content.strip()
        return _parse_size(sized.group(1)), (content[: sized.start()] + content[sized.end():]).strip()

    # ---- the forward pass -----------------------------------------------------------------------
    def forward(self, ids, all_logits: bool | None = None):
        """As Llm's; when `ids` are the last media prompt's ids, or their end while the cache holds
        the start (a prefix cache), its image and audio rows (and an mrope graph's positions) go in
        with them."""
        encoded, ids = self._encoded, [int(i) for i in np.asarray(ids).reshape(-1)]
        offset = len(encoded.ids) - len(ids) if encoded is not None else -1
        if offset >= 0 and encoded.ids[offset:] == ids and self.runtime.kv_meta.kept >= offset:
            if encoded.images or self.position_axes == 3:
                self._forward_positions = encoded.positions[:, offset:] + (self.runtime.kv_meta.kept - offset)
            images = [image.rows for image in encoded.images]
            for key, media in (("image_pad", images), ("audio_pad", encoded.audios)):
                pad = self.config.get(key)
                skipped = sum(token == pad for token in encoded.ids[:offset])
                self._media_rows[pad] = [row for rows in media for row in rows][skipped:]
                if key == "image_pad":
                    self._deepstack_rows = [row for image in encoded.images if image.deepstack is not None
                                            for row in image.deepstack.transpose(1, 0, 2)][skipped:]
            self._encoded = None   # its media enter the cache once
        try:
            return super().forward(ids, all_logits)
        finally:
            self._forward_positions = None
            self._media_rows, self._deepstack_rows = {}, []

    def _embed(self, ids: list[int]) -> np.ndarray:
        self._deepstack = None
        rows = super()._embed(ids)
        for key, noun, part in (("image_pad", "image", "<img>PATH</img>"), ("audio_pad", "audio", "<audio>PATH</audio>")):
            pad = self.config.get(key)
            waiting = self._media_rows.get(pad, [])
            slots = [i for i, token in enumerate(ids) if token == pad]
            if not slots or (len(ids) == 1 and not waiting):
                continue   # as MNN: one id is a text row, even a generated pad id
            if len(slots) > len(waiting):
                raise InputError(f"{key} tokens with no {noun}: put it in a prompt as {part} and forward the "
                                 "ids tokenizer_encode returned", field="input_ids")
            rows = np.array(rows, dtype=np.float32)
            deepstack = key == "image_pad" and self._deepstack_rows
            if deepstack:
                self._deepstack = np.zeros((self._deepstack_rows[0].shape[0], len(ids), rows.shape[1]), np.float32)
            for slot in slots:
                rows[slot] = waiting.pop(0)
                if deepstack:
                    self._deepstack[:, slot] = self._deepstack_rows.pop(0)
        return rows

    def _extra_feeds(self, rows: int) -> dict[str, np.ndarray]:
        """deepstack_embeds [layers, rows, hidden] for a Qwen3-VL graph: the image rows' features
        the last _embed put in, zeros elsewhere (text, decode steps, a fixed-shape chunk's pad). A graph
        without that input (Qwen3.5's, whose export sets has_deepstack too) gets none, as in MNN."""
        if not self.config.get("has_deepstack") or "deepstack_embeds" not in self.graph_inputs:
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
