"""kvcache_mmap and use_mmap: the KV cache, and the weights the CPU backend converts, in files under
tmp_path (never the model folder), with the same logits as in memory."""

from __future__ import annotations

import gc
import warnings

import numpy as np
import pytest

from mnngpu.backend import BackendConfig
from mnngpu.backend.kv import KVMeta
from mnngpu.backends.cpu import CPUBackend
from mnngpu.config import ConfigWarning
from mnngpu.errors import ConfigError
from mnngpu.format.quant import QuantizedLinear
from tests.backend.test_cpu_ops import conv_node, run
from tests.reference_model import MODEL_DIR, load_model, recorded


def model_files():
    return sorted((p.name, p.stat().st_size) for p in MODEL_DIR.rglob("*") if p.is_file())


def test_kvcache_mmap_keeps_the_kv_cache_in_files_under_tmp_path(tmp_path):
    before = model_files()
    ids = recorded("hello")["ids"] * 100    # past the first capacity step, so the files grow once
    want = np.asarray(load_model().forward(ids))
    model = load_model(kvcache_mmap=True, tmp_path=str(tmp_path / "scratch"))
    got = np.asarray(model.forward(ids))
    np.testing.assert_array_equal(got, want)
    files = sorted((tmp_path / "scratch").iterdir())
    layers = model.config.layer_nums
    assert len(files) == 2 * layers and all(f.name.startswith("mnngpu-kv-") for f in files)
    capacity = model.runtime.backend().kv_caches[0].k.shape[1]
    assert capacity >= len(ids) > 256
    assert all(f.stat().st_size == model.runtime.backend().kv_caches[0].k.nbytes for f in files)
    assert model_files() == before
    del model
    gc.collect()
    assert not any((tmp_path / "scratch").iterdir())   # removed with their arrays


@pytest.mark.parametrize("key", ["kvcache_mmap", "use_mmap"])
def test_mapped_files_need_a_tmp_path_outside_the_model_folder(key):
    with pytest.raises(ConfigError) as caught:
        load_model(**{key: True})
    assert caught.value.field == "tmp_path" and key in str(caught.value)
    with pytest.raises(ConfigError, match="inside the model folder") as caught:
        load_model(**{key: True, "tmp_path": str(MODEL_DIR / "tmp")})
    assert caught.value.field == "tmp_path"


def test_use_mmap_moves_converted_weights_to_files_with_the_same_output(tmp_path):
    rng = np.random.default_rng(3)
    oc, ic = 24, 40
    dense = rng.normal(0, 1, (oc, ic)).astype(np.float16)   # an fp16 export: widened to float32 at load
    empty = np.zeros((oc, 0), dtype=np.float32)
    x = rng.normal(0, 1, (3, ic, 1, 1)).astype(np.float32)
    outputs = []
    for use_mmap in (False, True):
        backend = CPUBackend(BackendConfig(precision="high", thread_num=1, use_mmap=use_mmap,
                                           tmp_path=str(tmp_path)), KVMeta())
        linear = QuantizedLinear(oc, ic, 16, ic, True, np.zeros((oc, 0), np.uint8), empty, empty, None,
                                 float_weight=dense)
        node = conv_node(linear)
        outputs.append(run(backend, node, [x]).reshape(3, oc))
        if use_mmap:
            assert isinstance(node.weights["packed"].dense, np.memmap)
            assert [p.name.startswith("mnngpu-weight-") for p in tmp_path.iterdir()] == [True]
    np.testing.assert_array_equal(outputs[1], outputs[0])
    np.testing.assert_allclose(outputs[0], x.reshape(3, ic) @ dense.astype(np.float32).T, rtol=1e-5, atol=1e-5)


def test_use_mmap_on_a_quantized_export_keeps_the_logits(tmp_path):
    ids = recorded("hello")["ids"]
    want = np.asarray(load_model().forward(ids))
    got = np.asarray(load_model(use_mmap=True, tmp_path=str(tmp_path)).forward(ids))
    np.testing.assert_array_equal(got, want)


def test_a_device_backend_says_once_that_kvcache_mmap_does_nothing(tmp_path):
    pytest.importorskip("pyopencl")
    from mnngpu.config import LlmConfig
    from mnngpu.runtime.schedule import RuntimeManager

    config = LlmConfig.load(MODEL_DIR)
    config.set_config({"backend_type": "opencl", "kvcache_mmap": True, "tmp_path": str(tmp_path)})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RuntimeManager.from_config(config)
    lines = [str(w.message) for w in caught if issubclass(w.category, ConfigWarning)]
    assert len(lines) == 1 and "kvcache_mmap" in lines[0] and "opencl" in lines[0]
