"""The one reader of ``weights.safetensors``: shapes and dtypes, arrays, or memory-mapped views.

Format: huggingface/safetensors README, "Format". Views need the data offsets, which the
``safetensors`` library does not expose, so :func:`mmap_tensors` reads the header JSON itself.
"""

from __future__ import annotations

import contextlib
import json
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hloserve.bundle import dtypes
from hloserve.errors import InvalidArgumentError, NotFoundError


@dataclass(frozen=True)
class WeightInfo:
    """Shape and dtype of one weight as stored in the safetensors file."""

    name: str
    shape: tuple[int, ...]
    dtype: str  # manifest token

    @property
    def nbytes(self) -> int:
        """Bytes of the stored tensor."""
        return int(np.prod(self.shape, dtype=np.int64)) * dtypes.from_token(self.dtype).itemsize


def stored_tensors(path: Path) -> dict[str, WeightInfo]:
    """Every tensor in the file, by name, from its header only; raises InvalidArgumentError: the
    file is missing, unreadable, or holds an unknown dtype."""
    with _open(path) as f:
        infos = {}
        for key in f.keys():  # noqa: SIM118  (safe_open is not a Mapping)
            tensor = f.get_slice(key)
            token = dtypes.from_safetensors(tensor.get_dtype()).token
            infos[key] = WeightInfo(key, tuple(tensor.get_shape()), token)
        return infos


@contextlib.contextmanager
def _open(path: Path) -> Iterator[Any]:
    """``safe_open`` for NumPy, its read errors raised as :class:`InvalidArgumentError`."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="numpy") as f:
            yield f
    except (OSError, SafetensorError) as exc:
        raise InvalidArgumentError(f"{path}: cannot read safetensors file: {exc}") from None


def _check_present(path: Path, names: Sequence[str], stored: Sequence[str]) -> None:
    missing = [n for n in names if n not in stored]
    if missing:
        raise NotFoundError(f"{path}: weights {missing} are not in the file")


def load_tensors(path: Path, order: Sequence[str]) -> list[np.ndarray]:
    """The tensors ``order`` as host NumPy arrays of their own (copies of the file's bytes); raises
    NotFoundError: a name is not in the file; InvalidArgumentError: the file cannot be read
    (:func:`stored_tensors`)."""
    with _open(path) as f:
        _check_present(path, order, list(f.keys()))
        return [f.get_tensor(name) for name in order]


def mmap_tensors(path: Path, order: Sequence[str]) -> list[np.ndarray]:
    """The tensors ``order`` as read-only memory-mapped arrays (no copy until used); raises
    NotFoundError: a name is not in the file; InvalidArgumentError: a malformed header."""
    with open(path, "rb") as f:
        try:
            (size,) = struct.unpack("<Q", f.read(8))
            header = json.loads(f.read(size))
        except (struct.error, ValueError) as exc:
            raise InvalidArgumentError(f"{path}: bad safetensors header: {exc}") from None
    _check_present(path, order, list(header))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    arrays = []
    for name in order:
        info = header[name]
        begin, end = info["data_offsets"]
        dtype = dtypes.from_safetensors(info["dtype"]).numpy
        arrays.append(data[begin:end].view(dtype).reshape(info["shape"]))
    return arrays
