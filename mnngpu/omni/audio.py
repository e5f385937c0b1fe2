"""Audio for an audio model (Qwen2-Audio style): reading WAV files, log-mel features, the audio module.

    waveform = read_wav("tone.wav")                 # float32 mono samples at 16 kHz, checked
    features = whisper_features(waveform)           # float32 [1, 128, frames]
    rows = AudioEncoder(...).encode(waveform)       # [tokens, hidden], one row per audio_pad

The steps follow MNN 3.6.1's Omni and its audio tools (the oracle's version): a WAV file's first
channel (8-, 16- or 32-bit PCM, scaled to [-1, 1)), resampled to 16 kHz by linear interpolation;
Whisper's log-mel features: the waveform reflect-padded by n_fft/2 on both sides, a symmetric
Hann window of 400 samples every 160, the power spectrum through 128 Slaney mel filters (0 to
8 kHz, area-normalized), the last frame dropped, log10 floored at 1e-10, clipped to 8 below its
maximum, then (x + 4) / 4. Decoding is the standard library's `wave` module (PCM WAV only).
"""

from __future__ import annotations

import io
import os
import wave
from pathlib import Path

import numpy as np

from mnngpu.errors import InputError, ModelFormatError

SAMPLE_RATE = 16000
N_FFT = 400
HOP = 160
N_MELS = 128
# Qwen2-Audio's encoder has 1500 positions after its stride-2 convolution: 3000 mel frames, 30 s.
# MNN cuts a longer clip to its first 30 s without a word; the engine refuses it instead.
MAX_FRAMES = 3000
PCM_SCALE = {1: (np.uint8, 128.0, 1.0), 2: (np.dtype("<i2"), 32768.0, 0.0),
             4: (np.dtype("<i4"), float(2**31 - 1), 0.0)}   # sample width: (dtype, divisor, offset)


def read_wav(source: str | os.PathLike | bytes, name: str = "audio") -> np.ndarray:
    """float32 samples at 16 kHz of a PCM WAV file (or its bytes): its first channel, as MNN reads
    it. One InputError, naming the file, for anything that is not a whole PCM WAV of at most 30 s."""
    where = name if isinstance(source, bytes) else os.fspath(source)
    if not isinstance(source, bytes) and not Path(where).is_file():
        raise InputError("no such audio file", path=where, field=name)
    opened = io.BytesIO(source) if isinstance(source, bytes) else where
    try:
        with wave.open(opened, "rb") as wav:
            channels, width, rate, frames = wav.getnchannels(), wav.getsampwidth(), wav.getframerate(), wav.getnframes()
            if width not in PCM_SCALE:
                raise InputError(f"{8 * width}-bit samples are not supported (8, 16 or 32-bit PCM)", path=where,
                                 field=name)
            _check_length(int(frames * SAMPLE_RATE / rate), where, name)
            data = wav.readframes(frames)
    except InputError:
        raise
    except (wave.Error, EOFError, OSError, ValueError, ZeroDivisionError) as exc:
        raise InputError(f"not a readable PCM WAV file ({type(exc).__name__}: {exc})", path=where,
                         field=name) from None
    if len(data) < frames * channels * width:
        raise InputError(f"truncated: the header says {frames} frames, the file holds "
                         f"{len(data) // (channels * width)}", path=where, field=name)
    dtype, divisor, offset = PCM_SCALE[width]
    samples = np.frombuffer(data, dtype=dtype).reshape(frames, channels)[:, 0]
    return resample(samples.astype(np.float32) / np.float32(divisor) - np.float32(offset), rate)


def _check_length(samples: int, where: str, name: str) -> None:
    frames = samples // HOP
    if frames > MAX_FRAMES:
        raise InputError(f"too long: {samples / SAMPLE_RATE:.1f} s, more than the {MAX_FRAMES * HOP / SAMPLE_RATE:.0f} s "
                         "the audio graph takes; cut the clip first", path=where, field=name)
    if audio_tokens(frames) < 1:
        raise InputError(f"too short: {samples} samples at 16 kHz make no audio token (at least {3 * HOP} samples)",
                         path=where, field=name)


def resample(samples: np.ndarray, rate: int) -> np.ndarray:
    """MNN's linear-interpolation resampling to 16 kHz (no low-pass filter)."""
    if rate == SAMPLE_RATE:
        return samples
    ratio = np.float32(SAMPLE_RATE / rate)
    count = int(samples.size * ratio)
    where = np.arange(count, dtype=np.float32) / ratio
    low = where.astype(np.int64)
    high = np.minimum(low + 1, samples.size - 1)
    frac = where - low
    return ((1 - frac) * samples[low] + frac * samples[high]).astype(np.float32)


def audio_tokens(frames: int) -> int:
    """Qwen2-Audio's tokens for `frames` mel frames: its stride-2 convolution, then pooling by 2."""
    return ((frames - 1) // 2 + 1) // 2 if frames > 0 else 0


def slaney_mel_filters() -> np.ndarray:
    """float64 [N_MELS, N_FFT // 2 + 1]: triangular filters evenly spaced on the Slaney mel scale
    from 0 to 8 kHz, each divided by its width in Hz over 2 (area normalization)."""
    def to_mel(hz):
        hz = np.asarray(hz, dtype=np.float64)
        log_region = hz >= 1000.0
        return np.where(log_region, 15.0 + np.log(np.maximum(hz, 1e-10) / 1000.0) / (np.log(6.4) / 27.0),
                        hz * 3.0 / 200.0)

    def to_hz(mel):
        return np.where(mel >= 15.0, 1000.0 * np.exp((np.log(6.4) / 27.0) * (mel - 15.0)), mel * 200.0 / 3.0)

    bins = np.linspace(0.0, SAMPLE_RATE / 2, N_FFT // 2 + 1)
    edges = to_hz(np.linspace(to_mel(0.0), to_mel(SAMPLE_RATE / 2), N_MELS + 2))
    left, centre, right = edges[:-2, None], edges[1:-1, None], edges[2:, None]
    rising = (bins - left) / (centre - left)
    falling = (right - bins) / (right - centre)
    return np.maximum(0.0, np.minimum(rising, falling)) * (2.0 / (right - left))


def whisper_features(waveform: np.ndarray) -> np.ndarray:
    """float32 [1, N_MELS, frames]: Whisper's log-mel features as MNN computes them."""
    padded = np.pad(waveform.astype(np.float64), N_FFT // 2, mode="reflect")
    count = (padded.size - N_FFT) // HOP + 1
    window = 0.5 * (1 - np.cos(2 * np.pi * np.arange(N_FFT) / (N_FFT - 1)))   # symmetric Hann
    frames = np.lib.stride_tricks.sliding_window_view(padded, N_FFT)[::HOP][:count] * window
    power = np.abs(np.fft.rfft(frames, axis=-1)) ** 2                       # [count, 201]
    mel = (power @ slaney_mel_filters().T)[:-1]                              # the last frame dropped
    log_mel = np.log10(np.maximum(mel, 1e-10))
    log_mel = (np.maximum(log_mel, log_mel.max() - 8.0) + 4.0) / 4.0
    return np.ascontiguousarray(log_mel.T[None], dtype=np.float32)


class AudioEncoder:
    """audio.mnn (+ audio.mnn.weight) run through the engine's runtime, and its features."""

    INPUTS = ("input_features",)

    def __init__(self, module, hidden_size: int, model_path: Path):
        names = tuple(module.input_names)
        if names != self.INPUTS:
            raise ModelFormatError(f"a Qwen2-Audio audio graph (inputs {list(self.INPUTS)}), got {list(names)}: "
                                   "Qwen2.5-Omni's windowed audio graph and other encoders are not implemented",
                                   path=model_path, field="inputs")
        self.module = module
        self.hidden_size = hidden_size

    def encode(self, waveform: np.ndarray) -> np.ndarray:
        """float32 [tokens, hidden], one row per audio_pad."""
        (embeds,) = self.module.forward({"input_features": whisper_features(waveform)}, ["audio_embeds"])
        return np.asarray(embeds, dtype=np.float32).reshape(-1, self.hidden_size)
