"""Try to export a tiny MiMo-shaped model with MNN's exporter, which writes mtp.mnn (MTP drafts)
only for `model_type` mimo and poi_qwen2_mtp.

transformers has no mimo architecture, so the HF folder carries its modelling code
(tools/mimo_modeling.py as modeling_mimo.py; the exporter loads with trust_remote_code).

    python -m tools.make_mtp_fixture OUT_DIR

llmexport 0.0.5 (and MNN's exporter source as of late 2026) loads the model and exports llm.mnn,
then stops in MimoMtp.forward: `TypeError: Attention.forward() got an unexpected keyword argument
'past_key_value'` (its MTP layer calls the exporter's Attention with an argument that Attention no
longer takes). So no MTP folder can be made offline yet; this script prints the exporter's error
and exits 1 until that is fixed, and otherwise leaves the export in OUT_DIR.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

from tools.make_fixtures import TINY_SHAPE, build_tokenizer
from tools.mimo_modeling import MiMoConfig, MiMoForCausalLM
from tools.mnn_export import copy_model_files, export_mnn

MODELING = Path(__file__).resolve().parent / "mimo_modeling.py"


def build_mimo(hf_dir: Path) -> None:
    import torch

    tok = build_tokenizer(hf_dir)
    config = MiMoConfig(vocab_size=tok.get_vocab_size(), eos_token_id=2, bos_token_id=0, pad_token_id=0,
                        torch_dtype="float32", **TINY_SHAPE)
    config.auto_map = {"AutoConfig": "modeling_mimo.MiMoConfig",
                       "AutoModelForCausalLM": "modeling_mimo.MiMoForCausalLM"}
    torch.manual_seed(23)
    MiMoForCausalLM(config).save_pretrained(hf_dir)
    shutil.copy2(MODELING, hf_dir / "modeling_mimo.py")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        hf_dir, export_dir = Path(tmp) / "hf", Path(tmp) / "out"
        build_mimo(hf_dir)
        try:
            export_mnn(hf_dir, export_dir, "--quant_bit", "4", "--quant_block", "64")
        except RuntimeError as error:
            lines = [line for line in str(error).splitlines() if line.strip()]
            sys.exit(f"llmexport could not export the MTP model: {lines[-1]}")
        if not (export_dir / "mtp.mnn").is_file():
            sys.exit("llmexport finished without writing mtp.mnn")
        copy_model_files(export_dir, args.out_dir)
        shutil.copy2(export_dir / "mtp.mnn", args.out_dir / "mtp.mnn")
    print(f"exported with mtp.mnn to {args.out_dir}")


if __name__ == "__main__":
    main()
