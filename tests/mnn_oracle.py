"""Record what MNN's own runtime (`MNN.llm`) does on a model folder, as a JSON file.

Run it as a subprocess (MNN.llm can segfault):
    python tests/mnn_oracle.py MODEL_DIR --prompts-json '["hello", ...]' --json-out ref.json --logits-out first.npy

For each prompt it records the prompt ids, a greedy continuation of `steps` tokens made by
`forward` with the KV cache kept, (optionally) the first step's full logits, and with --steps-top N
each greedy step's N largest logits; with --rows-top N instead every prefill row's N largest logits
(all_logits).
With --replies it records instead the bytes `response()` streams for each prompt, which runs
MNN's generation strategy (speculative_type) as its own engine does. With --image-embeds it also
records a vision model's image embeddings (visual.mnn run by MNN on MNN-made patches), and with
--audio-embeds an audio model's features and audio embeddings for a WAV file.
Settings are the oracle's: precision high, memory high, thread_num 2.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile

import numpy as np

ORACLE_SETTINGS = {"precision": "high", "memory": "high", "thread_num": 2}


def last_row(logits) -> np.ndarray:
    values = np.array(logits.read(), dtype=np.float32)
    return values.reshape(-1, values.shape[-1])[-1]


def top(logits: np.ndarray, k: int) -> list[list]:
    """[ids, values] of a row's k largest logits, largest first (ties: the lower id first)."""
    order = np.lexsort((np.arange(logits.size), -logits))[:k]
    return [[int(i) for i in order], [float(logits[i]) for i in order]]


def record(model_dir: str, prompts: list[str], steps: int, overrides: dict,
           steps_top: int = 0) -> tuple[dict, np.ndarray]:
    """steps_top > 0 also keeps each greedy step's top `steps_top` logits (the prompt's "steps_top")."""
    import MNN.llm as mnn_llm

    llm = mnn_llm.create(f"{model_dir}/config.json")
    llm.set_config({**ORACLE_SETTINGS, **overrides})  # MNN.llm json-encodes the dict itself
    llm.load()
    results, first_logits = [], []
    for text in prompts:
        llm.reset()
        ids = [int(i) for i in llm.tokenizer_encode(text)]
        logits = last_row(llm.forward(ids))
        first_logits.append(logits)
        greedy, tops = [int(np.argmax(logits))], [top(logits, steps_top)]
        while len(greedy) < steps:
            logits = last_row(llm.forward([greedy[-1]]))
            greedy.append(int(np.argmax(logits)))
            tops.append(top(logits, steps_top))
        results.append({"text": text, "ids": ids, "greedy": greedy, **({"steps_top": tops} if steps_top else {})})
    return {"settings": {**ORACLE_SETTINGS, **overrides}, "prompts": results}, np.stack(first_logits)


ROWS_CONFIG = "config_all_logits.json"


def record_rows(model_dir: str, prompts: list[str], overrides: dict, rows_top: int) -> dict:
    """Every row of each prompt's prefill with all_logits on: its top `rows_top` logits ("rows_top").
    MNN 3.6.1 takes all_logits only from a config file, so a copy of config.json with it set is
    written beside it (the model's files are found from the config's folder) for the run."""
    import MNN.llm as mnn_llm

    config = os.path.join(model_dir, "config.json")
    rows_config = os.path.join(model_dir, ROWS_CONFIG)
    with open(config, encoding="utf-8") as f:
        settings = {**json.load(f), "all_logits": True}
    with open(rows_config, "w", encoding="utf-8") as f:
        json.dump(settings, f)
    try:
        llm = mnn_llm.create(rows_config)
        llm.set_config({**ORACLE_SETTINGS, **overrides})
        llm.load()
        results = []
        for text in prompts:
            llm.reset()
            ids = [int(i) for i in llm.tokenizer_encode(text)]
            rows = np.array(llm.forward(ids).read(), dtype=np.float32).reshape(len(ids), -1)
            results.append({"text": text, "ids": ids, "rows_top": [top(row, rows_top) for row in rows]})
    finally:
        os.remove(rows_config)
    return {"settings": {**ORACLE_SETTINGS, **overrides}, "prompts": results}


RESPONSE_LOG = b"[MNNLLM] response: "


def streamed_bytes(llm, text: str) -> bytes:
    """What response(text, stream=True) writes to the process's stdout, less the wheel's own
    log lines around it (the first line and the closing tag)."""
    sys.stdout.flush()
    saved = os.dup(1)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 1)
        try:
            llm.response(text, True)
        except UnicodeDecodeError:
            pass   # the wheel decodes the whole reply as UTF-8 after streaming it
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        sink.seek(0)
        data = sink.read()
    if not data.startswith(RESPONSE_LOG) or not data.endswith(RESPONSE_LOG + b"\n"):
        raise RuntimeError(f"unexpected response log from the MNN wheel: {data[:80]!r}")
    return data.partition(b"\n")[2][: -len(RESPONSE_LOG) - 1]


def record_replies(model_dir: str, prompts: list[str], overrides: dict) -> dict:
    import MNN.llm as mnn_llm

    llm = mnn_llm.create(f"{model_dir}/config.json")
    llm.set_config({**ORACLE_SETTINGS, **overrides})
    llm.load()
    replies = []
    for text in prompts:
        llm.reset()
        replies.append({"text": text, "reply_hex": streamed_bytes(llm, text).hex()})
    return {"settings": {**ORACLE_SETTINGS, **overrides}, "replies": replies}


def mnn_patches(model_dir: str, image_path: str, height: int, width: int, patch: int = 14):
    """Qwen2-VL patches [n, 3 * 2 * patch * patch] and patch (row, column) ids as MNN's Omni makes
    them: MNN's imread, its bilinear resize with the config's mean and norm, and the patch reshuffle
    in MNN's expr ops (Qwen3-VL's patches are 16 wide)."""
    # `from MNN import cv` would find the C extension's bare module, not MNN/cv.py's constants
    import MNN.cv as cv  # noqa: PLR0402
    import MNN.expr as F

    with open(f"{model_dir}/llm_config.json", encoding="utf-8") as f:
        config = json.load(f)
    image = cv.resize(cv.imread(image_path), [width, height], 0, 0, cv.INTER_LINEAR, cv.COLOR_BGR2RGB,
                      config["image_mean"], config["image_norm"])
    frame = F.convert(F.expand_dims(image, 0), F.NCHW)
    patches = F.concat([frame, frame], 0)
    grid_h, grid_w = height // patch, width // patch
    patches = F.reshape(patches, [1, 2, 3, grid_h // 2, 2, patch, grid_w // 2, 2, patch])
    patches = F.reshape(F.transpose(patches, [0, 3, 6, 4, 7, 2, 1, 5, 8]), [grid_h * grid_w, 3 * 2 * patch * patch])
    rows = np.zeros((2, grid_h * grid_w), dtype=np.int32)
    for i in range(grid_h):
        for j in range(grid_w):
            index = (i // 2) * (2 * grid_w) + (j // 2) * 4 + (i % 2) * 2 + j % 2
            rows[:, index] = (i, j)
    return np.array(patches.read(), dtype=np.float32), rows


def mnn_position_table(num_grid: int, grid_h: int, grid_w: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen3-VL's idx_tensor and weight_tensor [4, n] by MNN's Omni's loops: each patch's four
    nearest cells of the num_grid x num_grid position table and their bilinear weights, in
    merge-block order."""
    h_idxs = [np.float32(i) * np.float32(num_grid - 1) / np.float32(grid_h - 1) for i in range(grid_h)]
    w_idxs = [np.float32(j) * np.float32(num_grid - 1) / np.float32(grid_w - 1) for j in range(grid_w)]
    index = np.zeros((4, grid_h, grid_w), dtype=np.int32)
    weight = np.zeros((4, grid_h, grid_w), dtype=np.float32)
    for i, hi in enumerate(h_idxs):
        h0 = int(hi)
        h1, dh = min(h0 + 1, num_grid - 1), np.float32(hi - h0)
        for j, wj in enumerate(w_idxs):
            w0 = int(wj)
            w1, dw = min(w0 + 1, num_grid - 1), np.float32(wj - w0)
            index[:, i, j] = (h0 * num_grid + w0, h0 * num_grid + w1, h1 * num_grid + w0, h1 * num_grid + w1)
            one = np.float32(1)
            weight[:, i, j] = ((one - dh) * (one - dw), (one - dh) * dw, dh * (one - dw), dh * dw)

    def blocked(table: np.ndarray) -> np.ndarray:
        shaped = table.reshape(4, grid_h // 2, 2, grid_w // 2, 2).transpose(0, 1, 3, 2, 4)
        return np.ascontiguousarray(shaped.reshape(4, -1))

    return blocked(index), blocked(weight)


def mnn_windows(grid_h: int, grid_w: int) -> tuple[np.ndarray, np.ndarray]:
    """Qwen2.5-VL's window_index and [2, 1, n, n] attention masks, by MNN's Omni's loops."""
    rows, cols, side = grid_h // 2, grid_w // 2, 4
    n_h, n_w = (rows + side - rows % side) // side, (cols + side - cols % side) // side
    index, bounds = [], [0]
    for win_h in range(n_h):
        for win_w in range(n_w):
            count = 0
            for i in range(side):
                for j in range(side):
                    h, w = win_h * side + i, win_w * side + j
                    if h < rows and w < cols:
                        index.append(h * cols + w)
                        count += 1
            bounds.append(bounds[-1] + count * 4)
    n = grid_h * grid_w
    mask = np.zeros((2, 1, n, n), dtype=np.float32)
    mask[1] = np.finfo(np.float32).min
    for start, end in itertools.pairwise(bounds):
        mask[1, 0, start:end, start:end] = 0
    return np.array(index, dtype=np.int32), mask


def record_image_embeds(model_dir: str, image_path: str, sizes: list[list[int]]) -> dict[str, np.ndarray]:
    """visual.mnn's image_embeds from MNN's runtime (CPU, precision high) for the image at each size
    (and Qwen3-VL's deepstack features, under "deepstack HxW")."""
    import MNN.expr as F
    import MNN.nn as nn  # noqa: PLR0402

    runtime = nn.create_runtime_manager(({"backend": "CPU", "precision": "high", "memory": "high", "numThread": 2},))
    module = nn.load_module_from_file(f"{model_dir}/visual.mnn", [], [], runtime_manager=runtime,
                                      rearrange=True, shape_mutable=True)
    names = module.get_info()["inputNames"]
    qwen3 = len(names) == 5 and names[3] == "idx_tensor"
    patch = 16 if qwen3 else 14
    records = {}
    for height, width in sizes:
        patches, rows = mnn_patches(model_dir, image_path, height, width, patch)
        count = patches.shape[0]
        inputs = [F.const(patches, list(patches.shape)), F.const(rows.ravel(), [2, count], F.NCHW, F.int),
                  F.const(np.zeros(count * count, np.float32), [1, count, count])]
        if len(names) == 4:   # Qwen2.5-VL: windows
            index, mask = mnn_windows(height // 14, width // 14)
            inputs[2] = F.const(mask.ravel(), list(mask.shape))
            inputs.append(F.const(index, [count // 4], F.NCHW, F.int))
        if qwen3:
            with open(f"{model_dir}/llm_config.json", encoding="utf-8") as f:
                num_grid = json.load(f)["num_grid_per_side"]
            index, weight = mnn_position_table(num_grid, height // patch, width // patch)
            inputs += [F.const(index.ravel(), [4, count], F.NCHW, F.int), F.const(weight.ravel(), [4, count])]
        outs = module.forward(inputs)
        outs = outs if isinstance(outs, list) else [outs]
        records[f"{height}x{width}"] = np.array(outs[0].read(), dtype=np.float32).reshape(count // 4, -1)
        if len(outs) > 1:
            deepstack = np.array(outs[1].read(), dtype=np.float32)
            records[f"deepstack {height}x{width}"] = deepstack.reshape(-1, count // 4, deepstack.shape[-1])
    return records


def record_audio_embeds(model_dir: str, wav_path: str) -> dict[str, np.ndarray]:
    """A WAV file as MNN's Omni reads it: MNN's audio loader (16 kHz) and whisper_fbank (no chunk
    padding), and audio.mnn's audio_embeds from MNN's runtime (CPU, precision high) on them."""
    import MNN.audio as audio  # noqa: PLR0402
    import MNN.nn as nn  # noqa: PLR0402

    waveform, _ = audio.load(wav_path, 16000)
    features = audio.whisper_fbank(waveform, 16000, 128, 400, 160, 0)
    runtime = nn.create_runtime_manager(({"backend": "CPU", "precision": "high", "memory": "high", "numThread": 2},))
    module = nn.load_module_from_file(f"{model_dir}/audio.mnn", [], [], runtime_manager=runtime,
                                      rearrange=True, shape_mutable=True)
    out = module.forward([features])
    out = out[0] if isinstance(out, list) else out
    embeds = np.array(out.read(), dtype=np.float32)
    return {"waveform": np.array(waveform.read(), dtype=np.float32),
            "features": np.array(features.read(), dtype=np.float32),
            "audio_embeds": embeds.reshape(-1, embeds.shape[-1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir")
    parser.add_argument("--prompts-json", required=True)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--config-json", default="{}", help="extra set_config overrides")
    parser.add_argument("--steps-top", type=int, default=0, help="also keep each greedy step's top N logits")
    parser.add_argument("--json-out", required=True, help="where to write the JSON record (MNN prints to stdout)")
    parser.add_argument("--logits-out", help="save the first-step logits [n_prompts, vocab] as .npy")
    parser.add_argument("--replies", action="store_true", help="record response()'s streamed bytes instead")
    parser.add_argument("--rows-top", type=int, default=0,
                        help="record instead every prefill row's top N logits (all_logits on)")
    parser.add_argument("--image-embeds", nargs=2, metavar=("IMAGE", "SIZES_JSON"),
                        help="also record visual.mnn's output for IMAGE at each [height, width] of SIZES_JSON")
    parser.add_argument("--image-embeds-out", help="where --image-embeds writes its .npz")
    parser.add_argument("--audio-embeds", metavar="WAV",
                        help="also record MNN's waveform, whisper features and audio.mnn's output for WAV")
    parser.add_argument("--audio-embeds-out", help="where --audio-embeds writes its .npz")
    args = parser.parse_args()
    if args.audio_embeds:
        np.savez(args.audio_embeds_out, **record_audio_embeds(args.model_dir, args.audio_embeds))
    if args.image_embeds:
        image, sizes = args.image_embeds
        np.savez(args.image_embeds_out, **record_image_embeds(args.model_dir, image, json.loads(sizes)))
    if args.rows_top:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(record_rows(args.model_dir, json.loads(args.prompts_json), json.loads(args.config_json),
                                  args.rows_top), out, ensure_ascii=False)
        return
    if args.replies:
        with open(args.json_out, "w", encoding="utf-8") as out:
            json.dump(record_replies(args.model_dir, json.loads(args.prompts_json), json.loads(args.config_json)),
                      out, ensure_ascii=False)
        return
    result, logits = record(args.model_dir, json.loads(args.prompts_json), args.steps,
                            json.loads(args.config_json), args.steps_top)
    if args.logits_out:
        np.save(args.logits_out, logits)
    with open(args.json_out, "w", encoding="utf-8") as out:
        json.dump(result, out, ensure_ascii=False)


if __name__ == "__main__":
    main()
