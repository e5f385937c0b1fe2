"""Finding the tokenizer file, and the errors a damaged file gets."""

from __future__ import annotations

import shutil
import struct
import warnings

import pytest

from mnngpu.errors import TokenizerError
from mnngpu.tokenizer import load_tokenizer
from tests.tokenizer.tokenizer_fixtures import tokenizer
from tools.make_tokenizer_fixtures import FIXTURE_ROOT


def copy_fixture(name: str, file: str, folder, as_name: str | None = None):
    target = folder / (as_name or file)
    shutil.copy(FIXTURE_ROOT / name / file, target)
    return target


def test_a_missing_configured_file_falls_back_to_the_only_tokenizer_file_with_one_warning(tmp_path):
    # llmexport 0.0.5 writes "tokenizer_file": "tokenizer.mtok" beside a tokenizer.txt.
    copy_fixture("sentencepiece", "tokenizer.txt", tmp_path)
    (tmp_path / "tokenizer_config.json").write_text("{}")   # not an MNN tokenizer: not a candidate
    with pytest.warns(UserWarning, match="tokenizer.txt"):
        tok = load_tokenizer(tmp_path, "tokenizer.mtok")
    assert tok.encode("hello world") == tokenizer("sentencepiece").encode("hello world")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_tokenizer(tmp_path, "tokenizer.mtok")


@pytest.mark.parametrize("files", [[], ["tokenizer.txt", "tokenizer.mtok"]])
def test_a_missing_configured_file_without_exactly_one_candidate_is_an_error(tmp_path, files):
    for file in files:
        copy_fixture("mtok_qwen" if file.endswith("mtok") else "bert", file, tmp_path)
    with pytest.raises(TokenizerError, match="tokenizer.model.*tokenizer_file"):
        load_tokenizer(tmp_path, "tokenizer.model")


def write(tmp_path, data: bytes):
    (tmp_path / "tokenizer.txt").write_bytes(data)
    return tmp_path


@pytest.mark.parametrize("data, where", [
    (b"431 0\n0 0 0\n\n1\n", "line 1"),
    (b"430 9\n0 0 0\n\n", "line 1"),
    (b"430 0\n2 1\n1 2\n", "line 2"),
    (b"430 0\n2 1 0\n1 2\n", "line 3"),
    (b"430 0\n0 0 0\n\n2\nPHM+ 0.0 3\nnot-base64! x y\n", "line 6"),
    (b"430 0\n0 0 0\n\n3\nPHM+ 0.0 3\n", "line 6"),
    (b"430 1\n0 0 0\n\nmany\n", "line 4"),
    (b"430 3\n0 0 0\n\n2\n", "line 4"),
])
def test_a_damaged_text_file_names_the_file_and_line(tmp_path, data, where):
    with pytest.raises(TokenizerError, match=f"tokenizer.txt: {where}: "):
        load_tokenizer(write(tmp_path, data), "tokenizer.txt")


def test_a_truncated_mtok_names_the_byte_offset_and_section(tmp_path):
    data = (FIXTURE_ROOT / "mtok_qwen" / "tokenizer.mtok").read_bytes()
    (tmp_path / "tokenizer.mtok").write_bytes(data[:len(data) // 2])
    with pytest.raises(TokenizerError, match=r"tokenizer.mtok: byte offset \d+ \(model\): the file ends early"):
        load_tokenizer(tmp_path, "tokenizer.mtok")


def test_an_unknown_mtok_model_tag_is_an_error(tmp_path):
    header = b"430 4\n0 0 0\n\n"
    body = bytes([0, 0]) + bytes([9]) + struct.pack("<I", 0)   # no normalizer, no pre-tokenizer, model 9
    (tmp_path / "tokenizer.mtok").write_bytes(header + body)
    with pytest.raises(TokenizerError, match=r"byte offset 15 \(model\): expected a model tag"):
        load_tokenizer(tmp_path, "tokenizer.mtok")
