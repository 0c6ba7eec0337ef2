"""The streaming .safetensors writer (NOTE [checkpoints without gathering]): what it writes
from strided views reads back through safetensors' own reader, and a writer that is given
tensors out of order, or too few, refuses."""
import numpy as np
import pytest
from safetensors import safe_open

from ratrain.models.safetensors_writer import SafetensorsWriter


def test_views_written_in_order_read_back_with_safetensors(tmp_path):
    rng = np.random.default_rng(0)
    flat = rng.standard_normal(4 * 3 + 5, dtype=np.float32)   # a layer's flat state
    tensors = {"a.weight": flat[:12].reshape(4, 3), "a.bias": flat[12:],
               "half": rng.standard_normal((2, 3)).astype(np.float16)[:, ::2],  # strided
               "ids": np.arange(7, dtype=np.int32)}
    layout = [(n, t.dtype.name, t.shape) for n, t in tensors.items()]
    with SafetensorsWriter(tmp_path / "x.safetensors", layout, {"format": "pt"}) as w:
        for name, value in tensors.items():
            w.write(name, value)
    with safe_open(str(tmp_path / "x.safetensors"), framework="numpy") as f:
        assert f.metadata() == {"format": "pt"}
        assert sorted(f.keys()) == sorted(tensors)
        for name, value in tensors.items():
            np.testing.assert_array_equal(f.get_tensor(name), value)
    assert (tmp_path / "x.safetensors").stat().st_size % 8 == (8 + w.nbytes) % 8


def test_out_of_order_or_missing_tensors_are_refused(tmp_path):
    layout = [("a", "float32", (2,)), ("b", "float32", (3,))]
    w = SafetensorsWriter(tmp_path / "y.safetensors", layout)
    with pytest.raises(ValueError, match="got b float32\\[3\\], expected a float32\\[2\\]"):
        w.write("b", np.zeros(3, np.float32))
    w = SafetensorsWriter(tmp_path / "z.safetensors", layout)
    w.write("a", np.zeros(2, np.float32))
    with pytest.raises(ValueError, match="1 tensors never written \\(first b\\)"):
        w.close()
