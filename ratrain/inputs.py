"""What a user names on the command line, read or refused in one line (UserError): a
model (preset, config.json or checkpoint directory), its HF config as written, and a
hardware profile.
"""
from __future__ import annotations

import json

from ratrain import models
from ratrain.errors import UserError
from ratrain.hw import Profile, ProfileError, load_profile
from ratrain.models.config import _config_file


def load_model(model: str) -> tuple[dict, str]:
    try:
        return models.get_config(model), model
    except (ValueError, FileNotFoundError, OSError) as e:
        raise UserError(str(e)) from None


def read_hf_config(model: str) -> dict | None:
    """The model's config dict as its file or preset holds it, before defaults are filled
    in: what checkpoints write back as config.json (NOTE [checkpoints transformers loads]
    in rt/run.py). None if it cannot be read (load_model reports why)."""
    try:
        with open(_config_file(model)) as f:
            raw = json.load(f)
    except (ValueError, OSError):
        return None
    return raw if isinstance(raw, dict) else None


def load_hw(name_or_path: str) -> Profile:
    try:
        return load_profile(name_or_path)
    except ProfileError as e:
        raise UserError(str(e)) from None
