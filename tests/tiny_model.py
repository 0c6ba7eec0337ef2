"""The tiny model configs the tests compile, run and trace, declared once: TINY (a llama of
32 wide, 4 query and 2 key/value heads, vocabulary 64) and MINI (16 wide, 2 and 1 heads,
vocabulary 32: small enough for golden text). A test changes what it needs by name.

Importable from every test (`from tiny_model import tiny_config`): tests/conftest.py's
directory is on sys.path for the whole suite.
"""
TINY = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48,
        "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
        "vocab_size": 64, "max_position_embeddings": 16, "initializer_range": 0.1}
MINI = {"model_type": "llama", "hidden_size": 16, "intermediate_size": 24,
        "num_hidden_layers": 2, "num_attention_heads": 2, "num_key_value_heads": 1,
        "vocab_size": 32, "max_position_embeddings": 8}


def tiny_config(base: dict = TINY, filled: bool = True, **changes) -> dict:
    """`base` with `changes` (a field given None is left out, so the model's default
    applies), in base's field order; `filled`: with every default the models read
    (models.fill_defaults), else as a user's config.json would give it."""
    from ratrain import models  # only where filled: some tests keep JAX out of their process
    config = {k: v for k, v in {**base, **changes}.items() if v is not None}
    return models.fill_defaults(config) if filled else config
