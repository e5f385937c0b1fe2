"""The benchmark model as a GGUF Q4_0 for llama.cpp, from the same HuggingFace weights as the MNN export.

    python -m tools.make_bench_model --hf-out bench_models/qwen2_5_0_5b_shape_hf
    tools/build_llama_cpp.sh WORKDIR vulkan
    python -m tools.bench_model_gguf bench_models/qwen2_5_0_5b_shape_hf WORKDIR

runs llama.cpp's convert_hf_to_gguf.py (from WORKDIR's unpacked sdist) to an f16 GGUF, then
`llama-quantize --pure ... Q4_0`, writing bench_models/qwen2_5_0_5b_shape.q4_0.gguf.
--pure keeps every matrix Q4_0, the tied embedding / lm_head included (by default llama-quantize
gives the output matrix Q6_K), as the MNN export keeps every matrix int4.

The bench model's tokenizer is a small byte-level BPE that llama.cpp's converter does not know by
its hash; the converter is told it pre-tokenizes as Qwen2's does. Only speed is measured with it.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "bench_models" / "qwen2_5_0_5b_shape.q4_0.gguf"


def llama_cpp_source(workdir: Path) -> Path:
    found = sorted(workdir.glob("src/llama_cpp_python-*/vendor/llama.cpp/convert_hf_to_gguf.py"))
    if not found:
        raise SystemExit(f"no llama.cpp source under {workdir}/src: run tools/build_llama_cpp.sh {workdir} first")
    return found[-1].parent


# convert_hf_to_gguf.py with the unknown BPE pre-tokenizer named qwen2, run from the llama.cpp source
# folder (its `conversion` package) with gguf-py importable
PATCHED_CONVERTER = """
import runpy
import conversion
conversion.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen2"
runpy.run_path("convert_hf_to_gguf.py", run_name="__main__")
"""


def convert_to_f16(hf_dir: Path, source: Path, out: Path) -> None:
    """convert_hf_to_gguf.py on hf_dir, writing f16 weights to out."""
    paths = [str(source / "gguf-py"), *filter(None, [os.environ.get("PYTHONPATH")])]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    subprocess.run([sys.executable, "-c", PATCHED_CONVERTER, str(hf_dir.resolve()), "--outtype", "f16",
                    "--outfile", str(out.resolve())],
                   cwd=source, env=env, check=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("hf_dir", type=Path, help="the HuggingFace folder (make_bench_model.py --hf-out)")
    parser.add_argument("workdir", type=Path, help="tools/build_llama_cpp.sh's WORKDIR")
    parser.add_argument("--backend-build", default="vulkan", help="which WORKDIR/build-* has llama-quantize")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    f16 = args.out.with_suffix(".f16.gguf")
    convert_to_f16(args.hf_dir.resolve(), llama_cpp_source(args.workdir.resolve()), f16)
    quantize = args.workdir.resolve() / f"build-{args.backend_build}" / "bin" / "llama-quantize"
    subprocess.run([str(quantize), "--pure", str(f16), str(args.out), "Q4_0", "2"], check=True)
    f16.unlink()
    print(f"wrote {args.out}: {args.out.stat().st_size / 1e6:.1f} MB")


if __name__ == "__main__":
    main()
