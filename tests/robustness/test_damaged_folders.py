"""Damaged copies of every fixture folder: one clear MnnGpuError, at the right step, and the folder unchanged.

Each case copies a fixture folder, damages the copy, makes it read-only and runs the whole flow
(create, load, forward, tokenizer_encode, response). The first failing step must raise the
expected MnnGpuError subclass whose message names the damaged file; any other exception fails
the test; and the folder must end byte for byte as it was.
"""

from __future__ import annotations

import pytest

from tests.robustness.damages import Damage, every_model_damages, specific_damages, tokenizer_format_damages
from tests.robustness.folders import MODEL_NAMES, first_failure, model_copy, untouched

CASES = [pytest.param(model, damage, id=f"{model}-{damage}") for model in MODEL_NAMES
         for damage in every_model_damages(model)]
CASES += [pytest.param(model, damage, id=f"{model}-{damage}") for model, damage in specific_damages()]
CASES += [pytest.param("qwen2_int4_b64", damage, id=f"qwen2_int4_b64-{damage}")
          for damage in tokenizer_format_damages()]


def test_the_intact_copies_run_to_the_end(tmp_path):
    # Otherwise a damage could seem caught when the copy was broken to begin with.
    for model in MODEL_NAMES:
        folder = model_copy(tmp_path, model)
        with untouched(folder):
            assert first_failure(folder) == ("done", None)


@pytest.mark.parametrize(("model", "damage"), CASES)
def test_damaged_folder_raises_one_clear_error(tmp_path, model: str, damage: Damage):
    folder = model_copy(tmp_path, model)
    damage.apply(folder)
    with untouched(folder):
        stage, error = first_failure(folder)
    assert isinstance(error, damage.error), f"{damage}: reached {stage} with {error!r}"
    assert stage == damage.stage, f"{damage}: expected the error at {damage.stage}, got it at {stage}: {error}"
    if damage.names is not None:
        named = f"{folder / damage.names}:"
        assert named in str(error), f"{damage}: the message does not start from {named} {error}"
