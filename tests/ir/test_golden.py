"""Golden text of the forward and backward IR of a one-layer model.

On a mismatch the actual text is printed so it can be reviewed (the `golden` fixture of
tests/conftest.py; `pytest --update-goldens` rewrites the files).
"""
from pathlib import Path

import pytest

from ratrain import models
from ratrain.models.trace import trace_model
from tiny_model import MINI, tiny_config

GOLDEN = Path(__file__).parent / "golden"
ONE_LAYER = tiny_config(MINI, filled=False, num_hidden_layers=1)


@pytest.mark.parametrize("kind", ["embed", "decoder", "head"])
@pytest.mark.parametrize("direction", ["fwd", "bwd"])
def test_one_layer_ir(kind, direction, golden):
    tg = trace_model(models.fill_defaults(dict(ONE_LAYER)), micro_batch_size=1, seq_len=4)
    graph = getattr(tg.kinds[kind], direction)
    golden(GOLDEN / f"one_layer_{kind}_{direction}.txt", str(graph))


def test_text_is_deterministic():
    config = models.fill_defaults(dict(ONE_LAYER))
    first = str(trace_model(config, seq_len=4).kinds["decoder"].bwd)
    assert first == str(trace_model(config, seq_len=4).kinds["decoder"].bwd)
