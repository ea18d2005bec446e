"""The `v4serve` command line: codegen, its drift check and help, the serve placeholder."""
from __future__ import annotations

import shutil
import subprocess
import sys

from tests.conftest import REPO, replace_once


def _v4serve(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.main", *args], cwd=cwd,
                          capture_output=True, text=True, env=_env())


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": str(REPO)}


def test_codegen_help_explains_every_spec_section():
    result = _v4serve("codegen", "--help")
    assert result.returncode == 0
    for section in ("model", "topology", "prefill", "decode", "pools", "limits"):
        assert f"\n  {section}: " in result.stdout
    assert "num_speculative_tokens" in result.stdout and "rows_per_page" in result.stdout


def test_check_passes_on_the_repository():
    result = _v4serve("codegen", "--check")
    assert result.returncode == 0, result.stderr
    assert "generated/ matches 4 spec(s)" in result.stdout


def test_check_fails_on_drift_and_names_the_fix(tmp_path):
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    shutil.copytree(REPO / "generated", tmp_path / "generated",
                    ignore=shutil.ignore_patterns("__pycache__"))
    tiny = tmp_path / "specs" / "tiny.yaml"
    tiny.write_text(replace_once(tiny.read_text(), "max_num_seqs: 64", "max_num_seqs: 32"))
    result = _v4serve("codegen", "--check", cwd=tmp_path)
    assert result.returncode == 1
    assert "changed  tiny/contract.py" in result.stderr
    assert "run `make codegen`" in result.stderr

    assert _v4serve("codegen", cwd=tmp_path).returncode == 0
    assert _v4serve("codegen", "--check", cwd=tmp_path).returncode == 0


def test_a_bad_spec_fails_with_one_located_line(tmp_path):
    shutil.copytree(REPO / "specs", tmp_path / "specs")
    tiny = tmp_path / "specs" / "tiny.yaml"
    tiny.write_text(replace_once(tiny.read_text(), "  slots_per_rank: 4", "  slot_per_rank: 4"))
    result = _v4serve("codegen", cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("specs/tiny.yaml:")
    assert ": prefill.slot_per_rank: unknown key 'slot_per_rank'" in lines[0]
    assert not (tmp_path / "generated").exists()


def test_serve_takes_vllms_flag_names():
    result = _v4serve("serve", "--help")
    assert result.returncode == 0
    for flag in ("--model", "--host", "--port", "--served-model-name", "--api-key",
                 "--max-num-batched-tokens", "--long-prefill-token-threshold",
                 "--max-model-len", "--max-num-seqs", "--num-speculative-tokens", "--spec"):
        assert flag in result.stdout


def test_generate_prints_json_per_prompt_and_a_summary():
    import json

    fixture = REPO / "tests" / "fixtures" / "v4-tiny"
    golden = json.loads((fixture / "golden.json").read_text())["cases"][0]
    ids = ",".join(map(str, golden["prompt_ids"]))
    result = _v4serve("generate", "--spec", "reference", "--model", str(fixture),
                      "--prompt-ids", ids,
                      "--max-tokens", "16", "--ignore-eos", "--json")
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    assert lines[0]["output_token_ids"] == golden["greedy_ids"]
    assert lines[0]["finish_reason"] == "length"
    summary = lines[1]
    assert summary["output_tokens"] == 16 and summary["dispatches"]["prefill_main"] == 1
    assert summary["mtp"]["draft_tokens"] > 0


def test_generate_rejects_a_k_without_a_layout():
    result = _v4serve("generate", "--spec", "reference", "--model",
                      str(REPO / "tests" / "fixtures" / "v4-tiny"), "--prompt-ids", "5,6",
                      "--num-speculative-tokens", "2")
    assert result.returncode == 1
    assert "spec specs/reference.yaml has decode layouts for K in [0, 1]" in result.stderr
