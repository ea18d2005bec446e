"""The `v4serve` command line: codegen, its drift check and index, help on every flag,
stale specs refused, generate's checks and output, the port checked first."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from tests.conftest import REPO, replace_once


def _v4serve(*args: str, cwd=REPO) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "server.cli", *args], cwd=cwd,
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
    specs = len(list((REPO / "specs").glob("*.yaml")))
    assert f"generated/ matches {specs} spec(s)" in result.stdout


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
                 "--max-model-len", "--max-num-seqs", "--num-speculative-tokens", "--spec",
                 "--default-chat-template-kwargs"):
        assert flag in result.stdout


@pytest.mark.parametrize("value, error", [
    ('{"thinking": true}', None), ("{thinking}", "not JSON"), ("[1]", "a JSON object")])
def test_default_chat_template_kwargs_must_be_a_json_object(capsys, value, error):
    from server.cli import build_parser

    parser = build_parser()
    if error is None:
        args = parser.parse_args(["serve", "--default-chat-template-kwargs", value])
        assert args.default_chat_template_kwargs == {"thinking": True}
        return
    with pytest.raises(SystemExit):
        parser.parse_args(["serve", "--default-chat-template-kwargs", value])
    assert error in capsys.readouterr().err


@pytest.mark.slow
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


@pytest.mark.slow
def test_generate_rejects_a_k_without_a_layout():
    result = _v4serve("generate", "--spec", "reference", "--model",
                      str(REPO / "tests" / "fixtures" / "v4-tiny"), "--prompt-ids", "5,6",
                      "--num-speculative-tokens", "4")
    assert result.returncode == 1
    assert "spec specs/reference.yaml has decode layouts for K in [0, 1, 2, 3]" in result.stderr


@pytest.mark.slow
def test_generate_chooses_k_per_step_with_the_adaptive_policy(capsys):
    from server.cli import main

    code = main(["generate", "--spec", "reference", "--model",
                 str(REPO / "tests" / "fixtures" / "v4-tiny"), "--prompt-ids", "5,6,7",
                 "--max-tokens", "24", "--num-speculative-tokens", "3",
                 "--speculative-policy", "adaptive", "--json"])
    summary = json.loads(capsys.readouterr().out.splitlines()[-1])
    assert code == 0 and summary["mtp"]["policy"] == "adaptive"
    assert set(summary["mtp"]["decode_steps_by_k"]) == {"0", "1", "2", "3"}   # each tried
    assert {"decode_b8s1", "decode_b4s2", "decode_b4s3", "decode_b4s4"} \
        <= set(summary["dispatches"])                 # K=0 measured on the plain kernel
    with pytest.raises(SystemExit, match="--speculative-policy adaptive chooses K per step"):
        _generate(capsys, "--prompt-ids", "5,6", "--num-speculative-tokens", "0",
                  "--speculative-policy", "adaptive")


def _generate(capsys, *args: str) -> tuple[int, str]:
    """`v4serve generate` on the reference fixture, in this process: (exit code, stderr)."""
    from server.cli import main

    fixture = str(REPO / "tests" / "fixtures" / "v4-tiny")
    code = main(["generate", "--spec", "reference", "--model", fixture, *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(("flags", "message"), [
    (("--temperature", "nan"), "--temperature: temperature must be a finite number >= 0"),
    (("--top-p", "inf"), "--top-p: top_p must be a finite number in (0, 1]"),
    (("--repetition-penalty=-inf",), "--repetition-penalty: repetition_penalty must be"),
    (("--presence-penalty", "3"), "--presence-penalty: presence_penalty must be"),
    (("--seed", str(2**80)), "--seed: seed must be an integer in"),
    (("--top-k", "-2"), "--top-k: top_k must be -1 or 0 (off) or an integer in [1, "),
    (("--stop", ""), "--stop: stop must hold non-empty strings only"),
    (("--max-tokens", "0"), "--max-tokens: max_tokens must be an integer in [1, "),
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


def _flags(parser, path=("v4serve",)):
    """(command path, action) for every flag of every subcommand."""
    import argparse

    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _flags(sub, (*path, name))
        elif not isinstance(action, argparse._HelpAction):
            yield " ".join(path), action


def test_every_flag_has_help_and_shows_its_default():
    import argparse

    from server.cli import build_parser

    flags = list(_flags(build_parser()))
    assert len(flags) > 60
    for command, action in flags:
        assert action.help, f"{command} {action.option_strings or action.dest}: no help"
        shown = action.default not in (None, [], argparse.SUPPRESS) and not isinstance(
            action, (argparse._StoreTrueAction, argparse._StoreFalseAction))
        if shown and action.option_strings:
            assert "default" in action.help, f"{command} {action.option_strings}: no default"


def test_help_imports_neither_torch_nor_pydantic():
    probe = ("import sys\nfrom server.cli import build_parser\n"
             "build_parser().format_help()\n"
             "print(sorted(m for m in ('torch', 'pydantic', 'uvicorn') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True,
                            text=True, env=_env())
    assert result.stdout.strip() == "[]", result.stderr


def _edited_tiny(tmp_path):
    spec = tmp_path / "tiny.yaml"
    text = (REPO / "specs" / "tiny.yaml").read_text()
    spec.write_text(replace_once(text, "{k: 1, batch: 4, seq: 2}", "{k: 1, batch: 8, seq: 2}"))
    return spec


@pytest.mark.slow
@pytest.mark.parametrize("command", [("serve", "--port", "0"), ("generate", "--prompt", "x"),
                                     ("compile",)])
def test_a_spec_newer_than_its_generated_code_is_refused_before_loading(tmp_path, command):
    spec = _edited_tiny(tmp_path)
    result = _v4serve(*command, "--spec", str(spec), "--model", str(tmp_path / "absent"))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert f"spec {spec} has changed since generated/tiny/ was generated" in lines[0]
    assert f"run `v4serve codegen {spec}`" in lines[0]


def test_the_repositorys_spec_edited_names_make_codegen(tmp_path, monkeypatch):
    from server.cli import spec_check

    (tmp_path / "specs").mkdir()
    _edited_tiny(tmp_path).rename(tmp_path / "specs" / "tiny.yaml")
    monkeypatch.setattr(spec_check, "REPO", tmp_path)
    with pytest.raises(spec_check.StaleSpecError, match=r"specs/tiny.yaml has changed since "
                       r"generated/tiny/ was generated from it; run `make codegen`"):
        spec_check.load_current("tiny")
    typo = tmp_path / "specs" / "tiny.yaml"
    typo.write_text(replace_once(typo.read_text(), "  slots_per_rank: 4", "  slot_per_rank: 4"))
    with pytest.raises(spec_check.StaleSpecError, match=r"does not validate: .*tiny.yaml:\d+: "
                       r"prefill.slot_per_rank: unknown key"):
        spec_check.load_current("tiny")
    assert spec_check.load_current("reference").SPEC_NAME == "reference"  # absent: as is


@pytest.mark.slow
def test_a_missing_spec_file_is_refused(tmp_path):
    result = _v4serve("generate", "--spec", str(tmp_path / "none.yaml"), "--prompt", "x")
    assert result.returncode != 0
    assert f"--spec {tmp_path / 'none.yaml'}: no such spec file" in result.stderr


def test_codegen_of_one_new_spec_indexes_it_beside_the_others(tmp_path):
    for folder in ("specs", "generated"):
        shutil.copytree(REPO / folder, tmp_path / folder,
                        ignore=shutil.ignore_patterns("__pycache__"))
    text = (REPO / "specs" / "tiny.yaml").read_text()
    (tmp_path / "specs" / "mine.yaml").write_text(text)
    result = _v4serve("codegen", "specs/mine.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "new      mine/contract.py" in result.stdout
    assert "changed  __init__.py" in result.stdout and "missing" not in result.stdout
    index = (tmp_path / "generated" / "__init__.py").read_text()
    for package in ("mine", "tiny", "reference", "deepseek_v4_flash", "deepseek_v4_pro"):
        assert f'"{package}": "specs/' in index
    assert _v4serve("codegen", "--check", cwd=tmp_path).returncode == 0

    (tmp_path / "specs" / "mine.yaml").unlink()
    result = _v4serve("codegen", cwd=tmp_path)
    assert "removed  mine/contract.py" in result.stdout and "mine" not in \
        (tmp_path / "generated" / "__init__.py").read_text()


def test_generate_labels_each_of_several_completions(capsys):
    from server.cli import main

    fixture = str(REPO / "tests" / "fixtures" / "v4-tiny")
    code = main(["generate", "--spec", "reference", "--model", fixture, "--prompt-ids", "5,6",
                 "--prompt-ids", "7", "--max-tokens", "2"])
    out = capsys.readouterr().out.splitlines()
    assert code == 0
    assert out[0] == "=== --prompt-ids #1 ===" and out[2] == "=== --prompt-ids #2 ==="


def test_serve_refuses_a_port_in_use_before_loading(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        result = _v4serve("serve", "--port", str(port), "--model", str(tmp_path / "absent"))
    assert result.returncode != 0
    assert f"cannot listen on 127.0.0.1:{port}: the address is already in use" in result.stderr
    assert "absent" not in result.stderr          # it never got as far as the checkpoint


def test_the_api_keys_come_from_the_flag_else_the_environment(monkeypatch):
    import argparse

    from server.cli.serve import api_keys

    for name in ("VLLM_API_KEY", "V4SERVE_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    assert api_keys(argparse.Namespace(api_key=None)) == ()
    monkeypatch.setenv("V4SERVE_API_KEY", "from-v4serve")
    assert api_keys(argparse.Namespace(api_key=None)) == ("from-v4serve",)
    monkeypatch.setenv("VLLM_API_KEY", "from-vllm")
    assert api_keys(argparse.Namespace(api_key=None)) == ("from-vllm",)
    assert api_keys(argparse.Namespace(api_key=[""])) == ("from-vllm",)
    assert api_keys(argparse.Namespace(api_key=["a", "", "b"])) == ("a", "b")


def test_kv_cache_dtype_fp8_serves_the_specs_served_formats(capsys):
    """vLLM's --kv-cache-dtype: fp8 takes the spec's own served formats or its -fp8
    variant; a spec with neither is refused with what to declare."""
    from server.cli import main
    from server.cli.spec_check import served

    assert served("tiny", "fp8").SPEC_NAME == "tiny-fp8"
    assert served("tiny", "auto").SPEC_NAME == "tiny"
    assert served("deepseek-v4-flash", "fp8").SPEC_NAME == "deepseek-v4-flash"
    assert main(["plan", "--spec", "tiny", "--kv-cache-dtype", "fp8",
                 "--device-memory", "4GiB"]) == 0
    out = capsys.readouterr().out
    assert "spec tiny-fp8" in out and "fp8_ds    200 B/entry" in out
    assert main(["plan", "--spec", "reference", "--kv-cache-dtype", "fp8",
                 "--device-memory", "4GiB"]) == 2
    assert "spec reference stores its cache entries as computed and there is no " \
           "reference-fp8 spec" in capsys.readouterr().err


def test_a_variant_spec_serves_the_checkpoint_of_the_spec_it_extends(tmp_path, monkeypatch):
    """--spec tiny-bf16 or tiny-fp8 without --model serves models/tiny (the same
    checkpoint computed or cached otherwise); a spec with its own folder takes it."""
    from server.cli import spec_check

    assert spec_check.default_model("tiny-bf16") == REPO / "models" / "tiny"
    assert spec_check.default_model("tiny_fp8") == REPO / "models" / "tiny"
    monkeypatch.setattr(spec_check, "REPO", tmp_path)
    (tmp_path / "models" / "tiny-bf16").mkdir(parents=True)
    assert spec_check.default_model("tiny-bf16") == tmp_path / "models" / "tiny-bf16"
    assert spec_check.default_model("deepseek-v4-pro") == tmp_path / "models" / "deepseek-v4-pro"


def test_a_v41_spec_generates_at_k0_and_refuses_drafts_with_the_reason(capsys):
    """v41-tiny serves through `v4serve generate` (greedy, chunked at 128: the official
    code's tokens for golden.json's first case over 128 tokens); K > 0 exits with the
    reason (DSpark drafts are issue 58), not a traceback."""
    from server.cli import main

    v41 = REPO / "tests" / "fixtures" / "v41-tiny"
    cases = json.loads((v41 / "golden.json").read_text())["cases"]
    case = next(c for c in cases if len(c["prompt_ids"]) > 128)
    ids = ",".join(map(str, case["prompt_ids"]))
    assert main(["generate", "--spec", "v41-tiny", "--model", str(v41), "--prompt-ids", ids,
                 "--max-tokens", str(len(case["greedy_ids"])), "--temperature", "0",
                 "--ignore-eos", "--max-num-batched-tokens", "128", "--json"]) == 0
    first = json.loads(capsys.readouterr().out.splitlines()[0])
    assert first["output_token_ids"] == case["greedy_ids"]
    with pytest.raises(SystemExit, match="--num-speculative-tokens 1: spec specs/v41-tiny.yaml "
                                         "is DeepSeek V4.1, whose DSpark drafts are not "
                                         "launched yet"):
        main(["generate", "--spec", "v41-tiny", "--model", str(v41), "--prompt-ids", "5,6",
              "--num-speculative-tokens", "1"])
