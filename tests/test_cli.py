"""The `v4serve` command line: codegen, its drift check and help, the serve placeholder."""
from __future__ import annotations

import shutil
import subprocess
import sys

import pytest

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


def _generate(capsys, *args: str) -> tuple[int, str]:
    """`v4serve generate` on the reference fixture, in this process: (exit code, stderr)."""
    from server.main import main

    fixture = str(REPO / "tests" / "fixtures" / "v4-tiny")
    code = main(["generate", "--spec", "reference", "--model", fixture, *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (("--temperature", "nan"), "--temperature: temperature must be a finite number >= 0"),
    (("--top-p", "inf"), "--top-p: top_p must be a finite number in (0, 1]"),
    (("--repetition-penalty=-inf",), "--repetition-penalty: repetition_penalty must be"),
    (("--presence-penalty", "3"), "--presence-penalty: presence_penalty must be"),
    (("--seed", str(2**80)), "--seed: seed must be an integer in"),
    (("--top-k", "-2"), "--top-k: top_k must be -1 or 0 (off) or at least 1"),
    (("--stop", ""), "--stop: stop must hold non-empty strings only"),
    (("--max-tokens", "0"), "--max-tokens: max_tokens must be at least 1"),
    (("--prompt-ids", "5,x"), "--prompt-ids '5,x': give comma-separated token ids"),
    (("--prompt-ids", "5,600"), "--prompt-ids #2: token id 600 is outside the vocabulary"),
])
def test_generate_refuses_bad_flags_by_name(capsys, flags, message):
    code, err = _generate(capsys, "--prompt-ids", "5,6", *flags)
    assert code == 2 and message in err, err


@pytest.mark.parametrize(("line", "message"), [
    ("[5, NaN]", "not a JSON string or list of token ids: NaN is not allowed"),
    ("[5, 6", "not a JSON string or list of token ids"),
    ('[5, "a"]', "a JSON line must be a string or a non-empty list of integer token ids"),
    ("[true]", "a JSON line must be a string or a non-empty list of integer token ids"),
    ("[]", "a JSON line must be a string or a non-empty list of integer token ids"),
    ("[5, -1]", "token id -1 is outside the vocabulary"),
])
def test_generate_names_the_bad_line_of_a_prompts_file(capsys, tmp_path, line, message):
    prompts = tmp_path / "prompts.txt"
    prompts.write_text(f"[5, 6]\n\n{line}\n")
    code, err = _generate(capsys, "--prompts-file", str(prompts))
    assert code == 2 and f"{prompts}:3: {message}" in err, err


def test_generate_names_a_missing_prompts_file(capsys, tmp_path):
    code, err = _generate(capsys, "--prompts-file", str(tmp_path / "none.txt"))
    assert code == 2 and "none.txt" in err and "No such file" in err
