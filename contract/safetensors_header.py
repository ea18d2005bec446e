"""A safetensors file's header, read and checked without torch: the tensors' names,
dtypes, shapes and byte offsets. Codegen reads it (`v4serve spec new`); the weight
loader reads tensors through it (runtime/weights/safetensors_file.py).

Format: 8 bytes (little-endian u64) header length N, N bytes of JSON
{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__"?: {...}},
then the data, offsets relative to its start, little-endian.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

# dtype -> bytes per element; the header is read without torch (`v4serve spec new`)
ITEMSIZE = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1,
            "U8": 1, "BOOL": 1, "F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1}
MAX_HEADER = 100 * 2**20


class SafetensorsError(ValueError):
    """The file is not a readable safetensors file; the message names it."""


class SafetensorsHeader:
    """An open safetensors file (`fd`) and its checked header: names, dtypes, shapes and
    where each tensor's bytes are."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.fd = os.open(self.path, os.O_RDONLY)
        try:
            self._entries, self._base = self._header()
        except BaseException:
            os.close(self.fd)
            raise

    def _header(self) -> tuple[dict[str, dict], int]:
        size = os.fstat(self.fd).st_size
        head = os.pread(self.fd, 8, 0)
        if len(head) < 8:
            raise SafetensorsError(f"{self.path}: too short for a safetensors header")
        (length,) = struct.unpack("<Q", head)
        if length > min(MAX_HEADER, size - 8):
            raise SafetensorsError(f"{self.path}: header of {length} bytes does not fit")
        try:
            entries = json.loads(os.pread(self.fd, length, 8))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise SafetensorsError(f"{self.path}: unreadable header: {exc}") from None
        if not isinstance(entries, dict):
            raise SafetensorsError(f"{self.path}: the header is not a JSON object")
        entries.pop("__metadata__", None)
        base = 8 + length
        for name, entry in entries.items():
            self._check(name, entry, size - base)
        spans = sorted(tuple(e["data_offsets"]) for e in entries.values())
        for (_, end), (begin, _) in zip(spans, spans[1:]):
            if begin < end:
                raise SafetensorsError(f"{self.path}: two tensors share bytes {begin}..{end}")
        return entries, base

    def _check(self, name: str, entry: object, data_bytes: int) -> None:
        """One header entry: a known dtype, a shape of sizes, offsets inside the data
        that hold exactly that shape."""
        def sizes(value: object, count: int | None = None) -> bool:
            return isinstance(value, list) and (count is None or len(value) == count) and \
                all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in value)

        if not isinstance(entry, dict) or not sizes(entry.get("shape")) \
                or not sizes(entry.get("data_offsets"), 2):
            raise SafetensorsError(f"{self.path}: tensor {name} has no valid shape and "
                                   "data_offsets")
        if entry.get("dtype") not in ITEMSIZE:
            raise SafetensorsError(f"{self.path}: tensor {name} has dtype "
                                   f"{entry.get('dtype')!r}; readable: {sorted(ITEMSIZE)}")
        begin, end = entry["data_offsets"]
        numel = 1
        for d in entry["shape"]:
            numel *= d
        if not begin <= end <= data_bytes or \
                end - begin != numel * ITEMSIZE[entry["dtype"]]:
            raise SafetensorsError(f"{self.path}: tensor {name} has offsets {begin}..{end} "
                                   f"that do not hold its shape {entry['shape']}")

    def keys(self) -> list[str]:
        return list(self._entries)

    def dtype(self, name: str) -> str:
        """The stored dtype's safetensors name (F32, BF16, F8_E4M3, I8, ...)."""
        return self._entries[name]["dtype"]

    def span(self, name: str) -> tuple[int, int]:
        """Where tensor `name`'s bytes are in the file: (offset, length)."""
        begin, end = self._entries[name]["data_offsets"]
        return self._base + begin, end - begin

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._entries[name]["shape"])

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
