"""A model as a user has it from transformers, for the run-directory tests: a tied LLaMA's
config.json with its own byte-level BPE tokenizer.json (320 ids, so byte tokens would fit
its vocabulary too and a silent switch to bytes would train), optionally with weights, and
English-like text to train on."""
import json

import numpy as np

from ratrain import models

VOCAB = 320
CONFIG = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 32,
          "intermediate_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
          "num_hidden_layers": 2, "vocab_size": VOCAB, "rms_norm_eps": 1e-5,
          "max_position_embeddings": 64, "tie_word_embeddings": True, "eos_token_id": 1,
          "initializer_range": 0.1, "torch_dtype": "float32"}
WORDS = ("the quick brown fox jumps over a lazy dog while seven tired cats sleep in warm "
         "sunlight and a small bird sings softly near the old stone bridge").split()


def text(lines: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    return "".join(" ".join(rng.choice(WORDS, 10)) + ".\n" for _ in range(lines))


def write_model_dir(folder, weights: bool):
    """config.json and a transformers-saved BPE tokenizer (<unk> 0, </s> 1); with
    `weights`, model.safetensors of a seeded initialisation too."""
    from tokenizers import Tokenizer, models as tok_models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast
    folder.mkdir(parents=True, exist_ok=True)
    if weights:
        filled = models.fill_defaults(CONFIG)
        models.save_pretrained(folder, filled, models.init_params(filled, seed=11))
    (folder / "config.json").write_text(json.dumps(CONFIG))
    bpe = Tokenizer(tok_models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator([text(300, 0)], trainers.BpeTrainer(
        vocab_size=VOCAB, special_tokens=["<unk>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    PreTrainedTokenizerFast(tokenizer_object=bpe, unk_token="<unk>",
                            eos_token="</s>").save_pretrained(folder)
    return folder
