"""The loader's safetensors reader: the same tensors as safetensors' own, read into memory
of their own without mapping the file, and a clear error for a damaged file."""
from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load_file, save_file

from runtime.weights.loader import CheckpointError, load_params
from runtime.weights.safetensors_file import SafetensorsError, SafetensorsFile
from tests.model.support import FIXTURE, REF


@pytest.fixture
def path(tmp_path):
    tensors = {"a": torch.randn(3, 5), "b": torch.arange(7, dtype=torch.int32),
               "c": torch.randn(4, 64).to(torch.float8_e4m3fn),
               "d": torch.randn(2, 2).to(torch.bfloat16), "e": torch.zeros(0, 3),
               "f": torch.tensor(2.5)}
    out = tmp_path / "t.safetensors"
    save_file(tensors, str(out), metadata={"format": "pt"})
    return out


def test_reads_what_safetensors_reads_dtype_shape_and_bytes(path):
    want = load_file(str(path))
    f = SafetensorsFile(path)
    assert sorted(f.keys()) == sorted(want)
    for name, tensor in want.items():
        got = f.read(name)
        assert got.dtype == tensor.dtype and got.shape == tensor.shape
        assert torch.equal(got.reshape(-1).view(torch.uint8), tensor.reshape(-1).view(torch.uint8))
        assert f.shape(name) == tuple(tensor.shape)
    f.close()


def test_nothing_of_the_file_is_mapped(path):
    f = SafetensorsFile(path)
    held = [f.read(name) for name in f.keys()]
    with open("/proc/self/maps") as maps:
        assert str(path) not in maps.read()
    f.close()
    assert held[0].untyped_storage().nbytes() > 0      # the tensors outlive the file


@pytest.mark.parametrize("damage", ["truncate", "header", "offsets", "dtype", "list",
                                    "no offsets", "negative", "overlap"])
def test_a_damaged_file_is_a_checkpoint_error_naming_it(tmp_path, damage):
    tensors = load_file(str(FIXTURE / "model.safetensors"))
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "config.json").write_text((FIXTURE / "config.json").read_text())
    path = out / "model.safetensors"
    save_file(tensors, str(path))
    raw = bytearray(path.read_bytes())
    (length,) = struct.unpack("<Q", raw[:8])
    header = raw[8: 8 + length].decode()
    if damage == "truncate":
        raw = raw[: len(raw) - 1000]
    elif damage == "header":
        raw[8:12] = b"#!?!"
    elif damage == "offsets":
        raw[8: 8 + length] = header.replace('"data_offsets":[0,', '"data_offsets":[4,', 1) \
            .encode()
    elif damage == "dtype":
        raw[8: 8 + length] = header.replace('"F32"', '"Q7"', 1).encode()
    else:
        entries = json.loads(header)
        first, second = sorted((k for k in entries if k != "__metadata__"),
                               key=lambda k: entries[k]["data_offsets"][0])[:2]
        if damage == "list":
            entries = [entries]
        elif damage == "no offsets":
            del entries[first]["data_offsets"]
        elif damage == "negative":
            entries[first]["shape"][0] = -1
        else:                                   # the second tensor moved onto the first
            size = entries[second]["data_offsets"][1] - entries[second]["data_offsets"][0]
            entries[second]["data_offsets"] = [0, size]
        text = json.dumps(entries).encode()
        raw = bytearray(struct.pack("<Q", len(text))) + text + raw[8 + length:]
    path.write_bytes(bytes(raw))
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_params(out, REF)
    with pytest.raises(SafetensorsError):
        SafetensorsFile(path)


def test_reading_a_file_holds_the_tensor_read_not_the_file(tmp_path):
    """Peak resident memory of a fresh process that reads 8 tensors of 32 MiB one at a
    time and keeps a bfloat16 copy of each, as a loader does: the copies (128 MiB) and
    about one tensor more. Through safetensors' mapped reads the same loop peaks near
    387 MiB: every page read stays resident until the file closes."""
    import subprocess
    import sys

    from tests.conftest import REPO

    path = tmp_path / "big.safetensors"
    save_file({f"t{i}": torch.full((8, 2**20), float(i)) for i in range(8)}, str(path))
    script = f"""
import torch
from runtime.weights.safetensors_file import SafetensorsFile
def hwm():
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
torch.ones(1)
base = hwm()
f = SafetensorsFile({str(path)!r})
kept = [f.read(name).to(torch.bfloat16) for name in f.keys()]
assert [float(t[0, 0]) for t in kept] == [float(n[1:]) for n in f.keys()]
print(hwm() - base)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
                          timeout=120)
    grew = int(done.stdout.split()[-1]) if done.stdout else done.stderr
    mib = 2**20
    assert isinstance(grew, int) and grew < 128 * mib + 2 * 32 * mib + 16 * mib, grew
