"""Run MNN's real exporter (`llmexport`) on a HuggingFace-format folder, safely and offline.

Shared by make_fixtures.py, make_vision_fixture.py, make_audio_fixture.py, make_bench_model.py and
train_demo_model.py; record_oracle runs MNN's own runtime on an export (tests/mnn_oracle.py).

`mnn`'s converter imports MNN/tools/utils/log.py, which pip-installs a logging SDK into
whatever Python `pip` resolves to and then posts usage logs. We make that module raise
ImportError before anything imports it; the converter runs fine without it.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ORACLE = Path(__file__).resolve().parent.parent / "tests" / "mnn_oracle.py"
TELEMETRY_GUARD = 'raise ImportError("converter telemetry disabled by mnngpu tools")\n'


def _package_dir(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        sys.exit(f"error: the '{name}' package is not installed; run: pip install -e '.[fixtures,test]'")
    return Path(next(iter(spec.submodule_search_locations)))


def disable_converter_telemetry() -> Path:
    """Make MNN/tools/utils/log.py raise ImportError on import. Idempotent."""
    log_module = _package_dir("MNN") / "tools" / "utils" / "log.py"
    text = log_module.read_text()
    if not text.startswith(TELEMETRY_GUARD):
        log_module.write_text(TELEMETRY_GUARD + text)
    return log_module


def export_mnn(hf_dir: Path, out_dir: Path, *extra_args: str, quiet: bool = True,
               script_dir: Path | None = None) -> Path:
    """Export hf_dir to out_dir with `llmexport --export mnn`; returns out_dir. script_dir is the
    folder of the llmexport.py to run: the `llmexport` wheel's by default (tools/head_export.py
    passes MNN's own source at a newer commit)."""
    disable_converter_telemetry()
    script_dir = script_dir or _package_dir("llmexport")
    argv = [sys.executable, "llmexport.py", "--path", str(Path(hf_dir).resolve()),
            "--export", "mnn", "--dst_path", str(Path(out_dir).resolve()), *extra_args]
    done = subprocess.run(argv, cwd=script_dir, capture_output=quiet, text=True)
    if done.returncode != 0 or not (Path(out_dir) / "llm.mnn").exists():
        tail = (done.stdout or "")[-2000:] + (done.stderr or "")[-4000:]
        raise RuntimeError(f"llmexport failed for {hf_dir} (exit {done.returncode}):\n{tail}")
    return Path(out_dir)


MODEL_FILES = ("config.json", "llm_config.json", "llm.mnn", "llm.mnn.weight")


def copy_model_files(export_dir: Path, out_dir: Path) -> None:
    """Replace out_dir with an export's model files (not the exporter's intermediates)."""
    if out_dir.exists():
        shutil.rmtree(out_dir)
    out_dir.mkdir(parents=True)
    for path in sorted(Path(export_dir).iterdir()):
        if path.name in MODEL_FILES or path.name.startswith(("tokenizer", "embeddings")):
            shutil.copy2(path, out_dir / path.name)


def set_export_settings(dest: Path, changes: dict[str, dict]) -> None:
    """Merge {file name: {key: value}} into an export's JSON files (a fixture's own settings)."""
    for name, change in changes.items():
        path = Path(dest) / name
        path.write_text(json.dumps({**json.loads(path.read_text()), **change}, indent=4, ensure_ascii=False))


def record_oracle(model_dir: Path, prompts: list[str], *extra_args: str) -> dict:
    """What MNN's runtime does on model_dir: tests/mnn_oracle.py's JSON record of 16 greedy steps
    for each prompt, its first-step logits written to model_dir/first_logits.npy; extra_args are
    the oracle's other options (--image-embeds ..., --audio-embeds ...)."""
    with tempfile.TemporaryDirectory() as tmp:
        record = Path(tmp) / "oracle.json"
        subprocess.run([sys.executable, str(ORACLE), str(model_dir), "--prompts-json", json.dumps(prompts),
                        "--steps", "16", "--json-out", str(record),
                        "--logits-out", str(Path(model_dir) / "first_logits.npy"), *extra_args],
                       check=True, capture_output=True)
        return json.loads(record.read_text())


def folder_size(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def train_bpe_tokenizer(lines, vocab_size: int, special_tokens: list[str]):
    """A byte-level BPE tokenizer (GPT-2/Qwen style) trained offline on `lines`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=special_tokens,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(lines, trainer)
    return tok


CHATML_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def save_hf_tokenizer(tok, hf_dir: Path, eos: str, pad: str, bos: str | None = None,
                      chat_template: str = CHATML_TEMPLATE) -> None:
    """Write tokenizer.json + tokenizer_config.json the way transformers expects them."""
    from transformers import PreTrainedTokenizerFast

    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=eos, pad_token=pad, bos_token=bos)
    fast.chat_template = chat_template
    fast.save_pretrained(hf_dir)
