"""ModelArgs of both families: V4 exactly as before, V4.1 from each of its config
spellings, its layer roles and sources, and the checkpoint names they imply."""
from __future__ import annotations

import hashlib
import json

import pytest

import generated
from contract.checkpoint_layout import expected_shapes, fp8_block
from contract.engram_primes import engram_primes, engram_rows
from contract.model_args import ModelArgs
from contract.safetensors_header import SafetensorsHeader
from contract.v41_config import text_config
from tests.conftest import REPO

V41 = REPO / "tests" / "fixtures" / "v41-tiny"


def _v41_release() -> dict:
    return json.loads((V41 / "config.json").read_text())


def _v41_inference() -> dict:
    return json.loads((V41 / "inference" / "config.json").read_text())


def _digest(shapes: dict) -> str:
    blob = json.dumps(sorted((k, list(v)) for k, v in shapes.items()))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


@pytest.mark.parametrize(("spec", "count", "digest"), [
    ("reference", 263, "5c6a3a318b2083fe"), ("tiny", 263, "30271a79e42cb7e3"),
    ("deepseek_v4_flash", 35020, "5e2fb2a5ca4ec1d3"),
    ("deepseek_v4_pro", 73164, "ac474c9c9e6aa2ed")])
def test_v4_checkpoints_are_named_as_before(spec, count, digest):
    """The digests were taken before V4.1 existed in the contract."""
    args = ModelArgs.from_config(generated.load(spec).architecture.CONFIG)
    shapes = expected_shapes(args)
    assert (len(shapes), _digest(shapes)) == (count, digest)


def test_v4_args_keep_their_kinds_and_take_the_v4_defaults():
    args = ModelArgs.from_config(generated.load("reference").architecture.CONFIG)
    assert [args.kind(i) for i in range(5)] == ["sliding", "csa", "hca", "csa", "mtp"]
    assert [args.is_hash(i) for i in range(4)] == [True, False, False, False]
    assert (args.family, args.is_v41, args.hc_single_pass) == ("deepseek_v4", False, False)
    assert args.kv_source_layers == args.engram_layers == args.dspark_target_layers == ()
    assert fp8_block(args) == 128 and args.experts(4) == args.n_experts
    with pytest.raises(ValueError, match="layer roles are V4.1's"):
        args.role(1)


def test_both_v41_spellings_give_the_same_args():
    release, inference = _v41_release(), _v41_inference()
    assert ModelArgs.from_config(release) == ModelArgs.from_config(inference)
    assert ModelArgs.from_config(release) == ModelArgs.from_config(release["text_config"])
    flat = text_config(inference)
    for key, value in flat.items():
        if key != "rope_scaling":
            assert release["text_config"][key] == value, key
    assert flat["rope_scaling"] == release["text_config"]["rope_scaling"]


def test_v41_tiny_roles_and_sources():
    args = ModelArgs.from_config(_v41_release())
    assert (args.family, args.hc_single_pass, args.n_hash_layers) == ("deepseek_v41", True, 0)
    assert [args.role(i) for i in range(13)] == [
        "window", "window", "full", "reuse", "full", "reuse", "full", "reuse", "reindex",
        "reuse", "dspark", "dspark", "dspark"]
    assert [args.kind(i) for i in (0, 2, 6, 10)] == ["sliding", "csa2", "csa2", "mtp"]
    assert [args.kv_source(i) for i in range(10)] == [None, None, 2, 2, 4, 4, 6, 6, 6, 6]
    assert [args.index_source(i) for i in range(10)] == [None, None, 2, 2, 4, 4, 6, 6, 8, 8]
    assert [i for i in range(10) if args.candidate_restricted(i)] == [8]
    assert (args.experts(3), args.experts(10), args.active(10)) == (8, 4, 2)
    assert args.engram_layers == (1, 4) and args.dspark_target_layers == (7, 8, 9)


def test_v41_flash_roles_follow_the_release():
    flash = _v41_release()["text_config"] | {
        "num_hidden_layers": 40, "compress_ratios": [0, 0] + [2] * 18 + [1] * 20 + [0] * 3,
        "kv_source_layer_ids": [2, 8, 14, 20],
        "index_source_layer_ids": [2, 8, 14, 20, 24, 28, 32, 36]}
    args = ModelArgs.from_config(flash)
    roles = [args.role(i) for i in range(40)]
    assert [i for i, r in enumerate(roles) if r == "reindex"] == [24, 28, 32, 36]
    assert roles.count("reuse") == 40 - 2 - 4 - 4
    assert args.kv_source(39) == 20 and args.index_source(39) == 36


def test_v41_tiny_checkpoint_has_exactly_the_expected_tensors():
    args = ModelArgs.from_config(_v41_inference())
    header = SafetensorsHeader(V41 / "model.safetensors")
    try:
        stored = {name: tuple(header.shape(name)) for name in header.keys()}
    finally:
        header.close()
    assert expected_shapes(args) == stored
    assert fp8_block(args) == 32


def test_engram_tables_are_sized_by_their_primes():
    assert engram_primes(61, 4, 4, 2)[0] == [61, 67, 71, 73, 79, 83, 89, 97, 101, 103, 107, 109]
    assert engram_rows(61, 4, 4, 2) == [1040, 1786]
    assert engram_rows(16000000, 8, 4, 2) == [384006168, 384016682]   # V4.1-Flash
