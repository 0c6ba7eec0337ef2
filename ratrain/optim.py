"""AdamW with PyTorch's semantics (torch.optim.AdamW), in numpy, on flat fp32 arrays.

The reference execution and the runtime's fallback use it; the native kernel
(`adamw_step_f32`) must match it. Decoupled weight decay applies where `decay_mask` is 1
(parameters with two or more dimensions, by the training options).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class AdamW:
    lr: float = 1e-3                    # learning rate of this step
    beta1: float = 0.9                  # first-moment decay
    beta2: float = 0.95                 # second-moment decay
    eps: float = 1e-8                   # added to sqrt(v_hat)
    weight_decay: float = 0.0           # decoupled decay, times lr


def adamw_step(opt: AdamW, step: int, param, grad, m, v, decay_mask=None) -> None:
    """Update param, m, v in place for 1-based `step`."""
    if opt.weight_decay:
        decay = opt.lr * opt.weight_decay
        param -= (decay * param) if decay_mask is None else (decay * decay_mask * param)
    m *= opt.beta1
    m += (1 - opt.beta1) * grad
    v *= opt.beta2
    v += (1 - opt.beta2) * grad * grad
    bias1 = 1 - opt.beta1 ** step
    bias2 = 1 - opt.beta2 ** step
    denom = np.sqrt(v) / np.sqrt(bias2) + opt.eps
    param -= (opt.lr / bias1) * m / denom
