"""AdamW with PyTorch's semantics (torch.optim.AdamW), in numpy, on flat fp32 arrays, and
the dynamic loss scale of fp16 programs (torch.cuda.amp.GradScaler's rule).

The reference execution and the runtime's fallback use them; the native kernel
(`adamw_step_f32`) must match adamw_step. Decoupled weight decay applies where
`decay_mask` is 1 (parameters with two or more dimensions, by the training options).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

INITIAL_LOSS_SCALE = 2.0 ** 16          # GradScaler's init_scale
LOSS_SCALE_WINDOW = 2000                # GradScaler's growth_interval
GROWTH, BACKOFF = 2.0, 0.5              # GradScaler's growth_factor, backoff_factor


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


def as_float32(value: float) -> float:
    """`value` rounded to float32: GradScaler keeps its scale in a float32 tensor."""
    return float(np.float32(value))


@dataclass
class LossScaler:
    """The dynamic loss scale: the loss cotangent is multiplied by `scale`; a step whose
    gradients (anywhere in the world) are not all finite is skipped and halves it; after
    `growth_interval` finite steps in a row it doubles. Scale 1 that never changes is
    "no loss scaling" (fp32 programs never call update)."""
    scale: float = 1.0                  # the step's loss cotangent is multiplied by it
    growth_interval: int = LOSS_SCALE_WINDOW  # finite steps in a row before doubling
    growth_tracker: int = 0             # finite steps in a row since the last change

    def inverse(self) -> np.float32:
        """What gradients are multiplied by to unscale them (GradScaler: the float64
        reciprocal rounded to float32)."""
        return np.float32(1.0 / self.scale)

    def update(self, found_inf: bool) -> None:
        """After a step (torch's _amp_update_scale_): back off, or count toward growth."""
        if found_inf:
            self.scale, self.growth_tracker = as_float32(self.scale * BACKOFF), 0
            return
        self.growth_tracker += 1
        if self.growth_tracker == self.growth_interval:
            grown = as_float32(self.scale * GROWTH)
            self.scale = grown if math.isfinite(grown) else self.scale
            self.growth_tracker = 0


def starting_scaler(precision: str, scale: float = INITIAL_LOSS_SCALE,
                    growth_interval: int = LOSS_SCALE_WINDOW) -> LossScaler:
    """The loss scale a run starts from: `scale` for fp16 programs, 1 (none) for fp32."""
    return LossScaler(as_float32(scale) if precision == "fp16" else 1.0, growth_interval)
