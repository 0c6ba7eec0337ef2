"""Write a .safetensors file tensor by tensor, straight from where each tensor lies.

safetensors.numpy.save_file takes a dict of arrays and turns each into bytes first, so
writing a stage's weights and Adam moments would hold a second copy of them in memory:
gigabytes on a rank whose memory is its arena. The format is an 8-byte little-endian
header length, a JSON header (dtype, shape and byte range of every tensor, plus string
metadata) padded with spaces to 8 bytes, then the tensors' bytes in order; a writer that
knows every tensor's dtype and shape up front can write the header first and stream the
data from arena views. safetensors' own reader checks the result (tests/models).
"""
from __future__ import annotations

import json
import math
import os
import struct
from pathlib import Path

import numpy as np

DTYPES = {"float32": "F32", "float16": "F16", "bfloat16": "BF16", "float64": "F64",
          "int32": "I32", "int64": "I64", "uint8": "U8"}


class SafetensorsWriter:
    """`layout`: (name, dtype, shape) of every tensor, in the order `write` gets them."""

    def __init__(self, path, layout, metadata: dict[str, str] | None = None):
        self.path, self.pending = Path(path), list(layout)
        header, offset = {}, 0
        for name, dtype, shape in self.pending:
            nbytes = math.prod(shape) * np.dtype(dtype).itemsize
            header[name] = {"dtype": DTYPES[np.dtype(dtype).name], "shape": list(shape),
                            "data_offsets": [offset, offset + nbytes]}
            offset += nbytes
        if metadata:
            header["__metadata__"] = metadata
        text = json.dumps(header, separators=(",", ":")).encode()
        text += b" " * (-len(text) % 8)
        self.nbytes = offset
        self.file = open(self.path, "wb")
        self.file.write(struct.pack("<Q", len(text)) + text)

    def write(self, name: str, array: np.ndarray) -> None:
        """The next tensor of the layout; `array` may be any view of the right values."""
        if not self.pending:
            raise ValueError(f"{self.path}: {name} written after the last tensor")
        expected, dtype, shape = self.pending.pop(0)
        if (name, np.dtype(dtype), tuple(shape)) != (expected, array.dtype, array.shape):
            raise ValueError(f"{self.path}: got {name} {array.dtype}{list(array.shape)}, "
                             f"expected {expected} {np.dtype(dtype)}{list(shape)}")
        self.file.write(memoryview(np.ascontiguousarray(array)).cast("B"))

    def close(self) -> None:
        """Flush to disk; every tensor of the layout must have been written."""
        try:
            if self.pending:
                raise ValueError(f"{self.path}: {len(self.pending)} tensors never written "
                                 f"(first {self.pending[0][0]})")
            self.file.flush()
            os.fsync(self.file.fileno())
        finally:
            self.file.close()

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, kind, value, traceback) -> None:
        if kind is None:
            self.close()
        else:
            self.file.close()
