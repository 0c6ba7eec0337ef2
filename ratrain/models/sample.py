"""Sampling text from a model in one process: the next-token logits of ratrain's own layer
functions (models/layers.logits_fn, under jax.jit) and a choice per token: greedy, or
drawn at a temperature from the top-k logits with a seeded generator. `ratrain generate`
(cli/evaluate.py) runs it on a checkpoint's weights.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Sampling:
    max_new_tokens: int                 # tokens to add after the prompt at most
    greedy: bool = False                # the most likely token (transformers' do_sample=False)
    temperature: float = 1.0            # logits divided by it before the draw
    top_k: int = 0                      # draw among the k most likely tokens (0: all)
    seed: int = 0                       # seed of the draws


# NOTE [one fixed-length forward]: every token runs the model on one buffer of the prompt
# plus max_new_tokens ids, the positions not yet generated holding 0, and reads the
# logits at the last real position. Attention is causal, so the ids after a position do
# not change its logits; one shape means jax.jit compiles the forward once, where a
# growing sequence would compile it again for every length. Without a KV cache each
# token costs a whole forward: fine for the small models this is for.

def generate_ids(config: dict, params: dict, prompt: list[int], sampling: Sampling,
                 eos_id: int | None = None) -> list[int]:
    """The ids after `prompt` (NOTE [one fixed-length forward]); stops after `eos_id`."""
    import jax
    import jax.numpy as jnp
    from ratrain.models.layers import logits_fn
    forward = jax.jit(logits_fn(config))
    weights = {name: jnp.asarray(value) for name, value in params.items()}
    ids = np.zeros((1, len(prompt) + sampling.max_new_tokens), np.int32)
    ids[0, :len(prompt)] = prompt
    rng, new = np.random.default_rng(sampling.seed), []
    for position in range(len(prompt), ids.shape[1]):
        logits = np.asarray(forward(weights, ids)[0, position - 1])
        ids[0, position] = token = next_token(logits, sampling, rng)
        new.append(token)
        if token == eos_id:
            break
    return new


def next_token(logits: np.ndarray, sampling: Sampling, rng: np.random.Generator) -> int:
    """The id chosen from one position's logits [V]."""
    if sampling.greedy:
        return int(np.argmax(logits))
    scaled = logits.astype(np.float64) / sampling.temperature
    if 0 < sampling.top_k < scaled.size:
        kth = np.partition(scaled, -sampling.top_k)[-sampling.top_k]
        scaled = np.where(scaled >= kth, scaled, -np.inf)
    p = np.exp(scaled - scaled.max())
    return int(rng.choice(p.size, p=p / p.sum()))
