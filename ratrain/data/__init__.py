"""The user's text as training tokens: find the documents of a --data path (sources.py),
pick the model's tokenizer (tokenizer.py), tokenize once into a cached token stream next to
the data and read it back with np.memmap (cache.py). The runtime (rt/data.py) packs the
stream into rows of seq-len + 1 tokens.
"""
from ratrain.data.cache import cache_files, cache_key, token_stream
from ratrain.data.sources import DataError, TEXT_SUFFIXES, find_sources
from ratrain.data.tokenizer import TokenizerChoice, choose_tokenizer

__all__ = ["DataError", "TEXT_SUFFIXES", "TokenizerChoice", "cache_files", "cache_key",
           "choose_tokenizer", "find_sources", "token_stream"]
