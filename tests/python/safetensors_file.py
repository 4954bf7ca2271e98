"""Reading a safetensors file with numpy and torch alone, for the tests of
this directory (test_export.py, test_hf.py)."""

import json
import pathlib

import numpy as np
import torch

SAFETENSORS_DTYPES = {"F32": "<f4", "F16": "<f2", "I64": "<i8"}


def read_safetensors(path):
    """A safetensors file: 8-byte little-endian header length, the JSON
    header, then the raw little-endian tensors. Returns (tensors, metadata)."""
    data = pathlib.Path(path).read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    metadata = header.pop("__metadata__", {})
    tensors = {}
    for name, t in header.items():
        begin, end = t["data_offsets"]
        array = np.frombuffer(data[8 + n + begin:8 + n + end],
                              dtype=SAFETENSORS_DTYPES[t["dtype"]])
        tensors[name] = torch.from_numpy(array.reshape(t["shape"]).copy())
    return tensors, metadata
