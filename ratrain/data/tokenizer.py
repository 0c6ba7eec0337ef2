"""Which tokenizer turns the user's text into the model's token ids, and its end-of-document
token: --tokenizer DIR, else the tokenizer.json of the --resume checkpoint, else of the
--init-from checkpoint, else UTF-8 bytes (vocab 256, what the built-in corpus uses) when
the model's vocabulary holds them.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

from ratrain.data.encode import Encoder, byte_encode, hf_encode
from ratrain.data.sources import PIECE_BYTES, SMALL_PIECE_BYTES, DataError

TOKENIZER_FILE = "tokenizer.json"
BYTE_SEPARATOR = 0                      # NOTE [byte documents]
# special tokens that end a document, by preference, when neither the model's config
# (eos_token_id) nor tokenizer_config.json (eos_token) names one
EOS_NAMES = ("</s>", "<|endoftext|>", "<|end_of_text|>", "<eos>", "<|eot_id|>", "<|im_end|>")
# characters on either side of a line break that the cut probe tries (letters, digits,
# punctuation, a non-ASCII letter and a CJK one: the classes pre-tokenizer regexes know)
PROBE_SIDES = ("a", "Z", "7", ")", "_", "'", "#", ".", "é", "中")

# NOTE [byte documents]: byte tokens use all 256 ids for the UTF-8 bytes, so no id is
# free for an end-of-document token. Documents are separated by the NUL byte (id 0),
# which UTF-8 text does not otherwise contain; the model's eos_token_id is not used.


@dataclass(frozen=True)
class TokenizerChoice:
    path: Path | None                   # tokenizer.json; None: UTF-8 bytes
    source: str                         # where it came from, for messages
    digest: str                         # sha256 of tokenizer.json, or "bytes"
    eos_id: int                         # appended after every document

    def encoder(self) -> Encoder:
        """texts -> list of id arrays (no special tokens added; EOS is added by the caller),
        and the size of the pieces a long text may be cut into (NOTE [pieces of a long
        text])."""
        if self.path is None:
            return Encoder(byte_encode, SMALL_PIECE_BYTES)
        tokenizer = _load(self.path, self.source)
        piece = SMALL_PIECE_BYTES if cuts_at_line_breaks(tokenizer) else PIECE_BYTES
        return Encoder(hf_encode(tokenizer), piece)


def choose_tokenizer(config: dict, tokenizer: str | None, init_from: str | None,
                     resume: str | None = None) -> TokenizerChoice:
    """The tokenizer of a run (see the module docstring), or a one-line DataError. A
    resumed run tokenizes as it did before (a checkpoint holds its run's tokenizer files),
    so leaving out --tokenizer when resuming never switches to bytes."""
    if tokenizer is not None:
        path = Path(tokenizer)
        path = path if path.is_file() else path / TOKENIZER_FILE
        if not path.is_file():
            raise DataError(f"--tokenizer {tokenizer} holds no {TOKENIZER_FILE}; pass the "
                            "directory of the model's Hugging Face tokenizer")
        return _hf_choice(path, f"--tokenizer {tokenizer}", config)
    for flag, folder in (("--resume", resume), ("--init-from", init_from)):
        if folder is not None and (Path(folder) / TOKENIZER_FILE).is_file():
            return _hf_choice(Path(folder) / TOKENIZER_FILE, f"{flag} {folder}", config)
    vocab = int(config["vocab_size"])
    if vocab < 256:
        raise DataError(f"the model's vocabulary has {vocab} ids, too few for byte tokens "
                        f"(256), and no tokenizer.json was given: pass --tokenizer DIR")
    return TokenizerChoice(None, "byte tokens", "bytes", BYTE_SEPARATOR)


def _hf_choice(path: Path, source: str, config: dict) -> TokenizerChoice:
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return TokenizerChoice(path, source, digest, eos_id(config, path, source))


def eos_id(config: dict, path: Path, source: str) -> int:
    """The config's eos_token_id (the first of a list), else the tokenizer's EOS token."""
    configured = config.get("eos_token_id")
    if isinstance(configured, list):
        configured = configured[0] if configured else None
    if configured is not None:
        return int(configured)
    tokenizer = _load(path, source)
    for name in (_configured_eos(path.parent), *EOS_NAMES):
        if name is not None and (found := tokenizer.token_to_id(name)) is not None:
            return found
    raise DataError(f"cannot tell the end-of-document token of {source}: set eos_token_id "
                    f"in the model's config.json or eos_token in tokenizer_config.json")


def _configured_eos(folder: Path) -> str | None:
    """eos_token of tokenizer_config.json (a string or {"content": ...}), if any."""
    try:
        token = json.loads((folder / "tokenizer_config.json").read_text()).get("eos_token")
    except (OSError, ValueError, AttributeError):
        return None
    return token.get("content") if isinstance(token, dict) else token


def _load(path: Path, source: str):
    from tokenizers import Tokenizer
    try:
        return Tokenizer.from_file(str(path))
    except Exception as e:  # the library raises plain Exceptions for malformed files
        raise DataError(f"{source}: cannot read {path}: {str(e).splitlines()[0]}") from None


def cuts_at_line_breaks(tokenizer) -> bool:
    """Whether cutting a text after a line break between two non-space characters leaves
    every pre-token and normalized character as it was (NOTE [pieces of a long text]):
    probed with PROBE_SIDES on both sides, at the normalizer and the pre-tokenizer."""
    pre, norm = tokenizer.pre_tokenizer, tokenizer.normalizer
    if pre is None:  # the whole text is one word for the model
        return False
    for left in PROBE_SIDES:
        for right in PROBE_SIDES:
            whole, head, tail = f"{left}\n{right}", f"{left}\n", right
            if norm is not None and norm.normalize_str(whole) != \
                    norm.normalize_str(head) + norm.normalize_str(tail):
                return False
            if _pre_tokens(pre, whole) != _pre_tokens(pre, head) + _pre_tokens(pre, tail):
                return False
    return True


def _pre_tokens(pre_tokenizer, text: str) -> list[str]:
    return [token for token, _ in pre_tokenizer.pre_tokenize_str(text)]
