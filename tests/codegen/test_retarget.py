"""Retargeting: editing a spec's decode layout changes only the generated files it affects."""
from __future__ import annotations

import shutil

import numpy as np

from codegen.pipeline import generate
from runtime.device.launcher import Launcher
from runtime.device.pools import allocate_mtp_state, allocate_pools
from tests.conftest import REPO, import_fresh, replace_once


def test_b4s2_to_b8s2_changes_only_the_affected_files(tmp_path):
    specs = tmp_path / "specs"
    shutil.copytree(REPO / "specs", specs)
    out = tmp_path / "retargeted"
    generate(sorted(specs.glob("*.yaml")), out, root=tmp_path)

    tiny = specs / "tiny.yaml"
    tiny.write_text(replace_once(tiny.read_text(), "{k: 1, batch: 4, seq: 2}",
                                 "{k: 1, batch: 8, seq: 2}"))
    drift = generate(sorted(specs.glob("*.yaml")), out, root=tmp_path).drift

    assert drift.missing == [] and drift.extra == []
    # __init__: the spec's digest; contract: the layout; kernels: the decode ABI.
    # Request slots per rank stay 16: the widest layout was and is batch 8 x 2 micro-batches.
    assert drift.changed == ["tiny/__init__.py", "tiny/contract.py", "tiny/kernels.py"]

    pkg = import_fresh(tmp_path, "retargeted").load("tiny")
    wrapper = Launcher(pkg.kernels.DECODE_BY_K[1], backend="dryrun")
    ranks = pkg.contract.RANKS
    tables = {f"block_table_{n}": np.zeros((ranks, 8, g.table_width), np.int32)
              for n, g in pkg.pools.GROUPS.items()}
    weights = type("W", (), {"fingerprint": pkg.architecture.FINGERPRINT})()
    words = (pkg.architecture.CONFIG["vocab_size"] + 31) // 32
    outputs = wrapper.launch(slot_ids=np.zeros((ranks, 8), np.int32),
                         slot_gens=np.zeros((ranks, 8), np.int64),
                         draft_mask=np.full((ranks, 8, words), -1, np.int32),
                         pools=allocate_pools(pkg, {n: 1 for n in pkg.pools.GROUPS}),
                         mtp=allocate_mtp_state(pkg), weights=weights, context=10,
                         **tables)
    assert outputs.logits.shape == (ranks, 8, 2, pkg.architecture.CONFIG["vocab_size"])
