"""Checkpoints: bit-exact save/load round trip, HF-style sharded loading, clear errors."""
from __future__ import annotations

import json

import numpy as np
import pytest
from safetensors.numpy import save_file

from ratrain import models


def test_save_load_round_trip_is_bit_exact(tmp_path):
    config = models.get_config("tiny-qwen")
    params = models.init_params(config, seed=5)
    out = models.save_pretrained(tmp_path / "ckpt", config, params)
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors"]
    loaded_config, loaded = models.load_pretrained(out)
    assert loaded_config == config
    assert loaded.keys() == params.keys()
    for k in params:
        assert loaded[k].dtype == params[k].dtype and loaded[k].tobytes() == params[k].tobytes()


def _write_shards(path, params, n_shards):
    names = list(params)
    weight_map = {}
    for k in range(n_shards):
        file = f"model-{k + 1:05d}-of-{n_shards:05d}.safetensors"
        chunk = names[k::n_shards]
        save_file({n: params[n] for n in chunk}, str(path / file), metadata={"format": "pt"})
        weight_map |= {n: file for n in chunk}
    index = {"metadata": {"total_size": sum(v.nbytes for v in params.values())},
             "weight_map": weight_map}
    (path / "model.safetensors.index.json").write_text(json.dumps(index))


def test_sharded_checkpoint_loads(tmp_path):
    config = models.get_config("tiny-baichuan")
    params = models.init_params(config, seed=2)
    (tmp_path / "config.json").write_text(json.dumps(config))
    _write_shards(tmp_path, params, n_shards=3)
    _, loaded = models.load_pretrained(tmp_path)
    assert loaded.keys() == params.keys()
    assert all(np.array_equal(loaded[k], params[k]) for k in params)


def test_sharded_load_rejects_an_index_naming_missing_tensors(tmp_path):
    config = models.get_config("tiny")
    params = models.init_params(config, seed=0)
    (tmp_path / "config.json").write_text(json.dumps(config))
    _write_shards(tmp_path, params, n_shards=2)
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    index["weight_map"]["model.layers.9.mlp.up_proj.weight"] = "model-00001-of-00002.safetensors"
    (tmp_path / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="weight_map"):
        models.load_pretrained(tmp_path)


def test_bf16_tensors_widen_to_float32(tmp_path):
    import ml_dtypes
    config = models.get_config("tiny")
    (tmp_path / "config.json").write_text(json.dumps(config))
    w = np.array([[1.5, -2.0]], dtype=ml_dtypes.bfloat16)
    save_file({"lm_head.weight": w}, str(tmp_path / "model.safetensors"))
    _, loaded = models.load_pretrained(tmp_path)
    assert loaded["lm_head.weight"].dtype == np.float32
    assert loaded["lm_head.weight"].tolist() == [[1.5, -2.0]]


def test_load_without_weights_says_so(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(models.get_config("tiny")))
    with pytest.raises(ValueError, match="model.safetensors"):
        models.load_pretrained(tmp_path)


def test_a_rank_reads_only_the_tensors_it_names(tmp_path):
    """load_pretrained(names=...): a stage's weights only; a tied checkpoint's redundant
    lm_head.weight is checked where the embedding is read, and skipped elsewhere."""
    config = models.get_config("tiny-tied")
    params = models.init_params(config, seed=1)
    models.save_pretrained(tmp_path, config, params)
    middle = {"model.layers.1.mlp.up_proj.weight", "model.layers.1.input_layernorm.weight"}
    _, got = models.load_pretrained(tmp_path, middle)
    assert set(got) == middle and all(np.array_equal(got[n], params[n]) for n in middle)
    extra = dict(params, **{"lm_head.weight": params["model.embed_tokens.weight"] + 1})
    save_file(extra, str(tmp_path / "model.safetensors"))
    assert set(models.load_pretrained(tmp_path, middle)[1]) == middle
    with pytest.raises(ValueError, match="lm_head.weight differs"):
        models.load_pretrained(tmp_path, {"model.embed_tokens.weight"})
