"""A MoE export whose expert subgraph is missing or damaged: one ModelFormatError at load that
names llm.mnn and the subgraph (the catalogue in damages.py runs the whole flow on these too)."""

from __future__ import annotations

import pytest

from mnngpu.errors import ModelFormatError
from tests.robustness.damages import specific_damages
from tests.robustness.folders import first_failure, model_copy, untouched

MOE_DAMAGES = {damage.name: damage for model, damage in specific_damages() if model == "qwen3_moe_int4_b64"}


@pytest.mark.parametrize("name, field", [("MoE expert subgraph missing", "subgraphs['/expert/1_3']"),
                                         ("MoE expert subgraph input damaged", "subgraphs['/expert/0_0']")])
def test_damaged_expert_names_the_file_and_the_subgraph(tmp_path, name, field):
    folder = model_copy(tmp_path, "qwen3_moe_int4_b64")
    MOE_DAMAGES[name].apply(folder)
    with untouched(folder):
        stage, error = first_failure(folder)
    assert stage == "load" and isinstance(error, ModelFormatError)
    assert error.path == str(folder / "llm.mnn") and error.field == field
