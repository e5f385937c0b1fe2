"""Ask MNN's own tokenizer (`MNN.llm` 3.6.1) for ids, in a subprocess because MNN.llm can segfault.

`MNN.llm` has no tokenizer-only loader, but `Llm::load()` builds the tokenizer before it reads the
model, and only checks that `llm.mnn` and `llm.mnn.weight` can be opened. So a folder holding a
`config.json`, the tokenizer file and two empty model files is enough for `tokenizer_encode`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_WORKER = r"""
import json, sys, time
import MNN.llm as mnn_llm
request = json.load(open(sys.argv[1], encoding="utf-8"))
llm = mnn_llm.create(request["config"])
llm.load()
result = {"ids": [], "decode": [], "encode_seconds": None}
for text in request["texts"]:
    result["ids"].append([int(i) for i in llm.tokenizer_encode(text)])
for token in range(request["decode_count"]):
    try:
        result["decode"].append(llm.tokenizer_decode(token))
    except UnicodeDecodeError:
        result["decode"].append(None)
if request["timed_text"] is not None:
    start = time.perf_counter()
    llm.tokenizer_encode(request["timed_text"])
    result["encode_seconds"] = time.perf_counter() - start
json.dump(result, open(sys.argv[2], "w", encoding="utf-8"))
"""


def mnn_available() -> bool:
    done = subprocess.run([sys.executable, "-c", "import MNN.llm"], capture_output=True, check=False)
    return done.returncode == 0


def run_mnn_tokenizer(tokenizer_path: Path, texts: list[str], decode_count: int = 0,
                      timed_text: str | None = None, timeout: float | None = None) -> dict:
    """MNN's `tokenizer_encode` for each text, `tokenizer_decode` for ids below decode_count
    (None where the id's bytes are not valid UTF-8), and the seconds one encode of timed_text took.
    Raises subprocess.TimeoutExpired past `timeout` seconds."""
    tokenizer_path = Path(tokenizer_path)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        shutil.copy(tokenizer_path, folder / tokenizer_path.name)
        (folder / "llm.mnn").touch()
        (folder / "llm.mnn.weight").touch()
        (folder / "config.json").write_text(json.dumps({"tokenizer_file": tokenizer_path.name}))
        request = {"config": str(folder / "config.json"), "texts": texts,
                   "decode_count": decode_count, "timed_text": timed_text}
        (folder / "request.json").write_text(json.dumps(request), encoding="utf-8")
        argv = [sys.executable, "-c", _WORKER, str(folder / "request.json"), str(folder / "result.json")]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"MNN tokenizer run failed for {tokenizer_path} "
                               f"(exit {done.returncode}):\n{done.stderr[-3000:]}")
        return json.loads((folder / "result.json").read_text(encoding="utf-8"))
