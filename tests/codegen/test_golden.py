"""Golden snapshots: generated/ is exactly what the checked-in specs generate."""
from __future__ import annotations

import shutil
from pathlib import Path

from codegen.pipeline import generate
from codegen.writer import compare
from tests.conftest import REPO, SPECS, import_fresh


def _regenerate(tmp_path: Path) -> Path:
    out = tmp_path / "generated"
    generate(sorted(SPECS.glob("*.yaml")), out, root=REPO)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and "__pycache__" not in p.parts}


def test_generated_tree_matches_specs_file_by_file(tmp_path):
    fresh, golden = _files(_regenerate(tmp_path)), _files(REPO / "generated")
    assert sorted(set(fresh) - set(golden)) == [], "missing from generated/: run `make codegen`"
    assert sorted(set(golden) - set(fresh)) == [], "stale files in generated/: run `make codegen`"
    changed = [rel for rel in fresh if fresh[rel] != golden[rel]]
    assert changed == [], "generated/ drifted from specs/: run `make codegen`"


def test_every_spec_has_a_package_with_every_kernel(tmp_path):
    out = _regenerate(tmp_path)
    for spec in ("tiny", "reference", "deepseek_v4_flash", "deepseek_v4_pro"):
        files = sorted(p.name for p in (out / spec).glob("*.py"))
        assert files == ["__init__.py", "architecture.py", "contract.py", "kernels.py",
                         "pools.py"]
        kernels = import_fresh(out.parent, out.name).load(spec).kernels.KERNELS
        assert sorted(kernels) == ["decode_b4s2", "decode_b4s3", "decode_b4s4", "decode_b8s1",
                                   "decode_b8s1_mtp", "prefill_main", "prefill_mtp"]


def test_every_file_carries_the_generated_header(tmp_path):
    out = _regenerate(tmp_path)
    for rel, data in _files(out).items():
        first = data.decode().splitlines()[0]
        assert first.startswith("# @generated from specs/") and first.endswith(
            "by codegen — do not edit"), rel


def test_output_is_byte_deterministic(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    generate(sorted(SPECS.glob("*.yaml")), a / "generated", root=REPO)
    generate(sorted(SPECS.glob("*.yaml"), reverse=True), b / "generated", root=REPO)
    assert _files(a / "generated") == _files(b / "generated")


def test_compare_reports_missing_changed_and_extra(tmp_path):
    out = _regenerate(tmp_path)
    files = {rel: data.decode() for rel, data in _files(out).items()}
    (out / "tiny" / "pools.py").unlink()
    (out / "tiny" / "contract.py").write_text("# edited by hand\n")
    (out / "tiny" / "decode_b2s3.py").write_text("# stale\n")
    drift = compare(files, out, ["."])
    assert drift.missing == ["tiny/pools.py"]
    assert drift.changed == ["tiny/contract.py"]
    assert drift.extra == ["tiny/decode_b2s3.py"]
    assert not drift.clean


def test_write_touches_only_changed_files_and_removes_stale_ones(tmp_path):
    out = _regenerate(tmp_path)
    untouched = out / "tiny" / "pools.py"
    stamp = untouched.stat().st_mtime_ns
    (out / "tiny" / "contract.py").write_text("# edited by hand\n")
    stale_pkg = out / "old_spec" / "kernels"
    stale_pkg.mkdir(parents=True)
    (stale_pkg / "decode_b1s1.py").write_text("# stale\n")
    result = generate(sorted(SPECS.glob("*.yaml")), out, root=REPO)
    assert result.drift.changed == ["tiny/contract.py"]
    assert result.drift.extra == ["old_spec/kernels/decode_b1s1.py"]
    assert not (out / "old_spec").exists()
    assert untouched.stat().st_mtime_ns == stamp


def test_single_spec_generation_leaves_other_packages_alone(tmp_path):
    out = tmp_path / "generated"
    shutil.copytree(REPO / "generated", out, ignore=shutil.ignore_patterns("__pycache__"))
    result = generate([SPECS / "tiny.yaml"], out, root=REPO, every=False)
    assert result.drift.clean and result.drift.extra == []
    assert (out / "deepseek_v4_pro" / "pools.py").exists()
