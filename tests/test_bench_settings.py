"""bench/offline.py's --speculation settings: labels, controls, and the adaptive policy
at a git revision (what a change to the policy is measured against)."""
import subprocess
from pathlib import Path

import pytest

from bench.offline import label, policy_at, settings
from runtime.core.speculation import Acceptance, AdaptiveSpeculation

ROOT = Path(__file__).resolve().parent.parent


def _in_git() -> bool:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT,
                          capture_output=True).returncode == 0


def test_settings_label_each_entry_and_a_second_copy_as_its_control():
    out = settings("tiny", "0,1,adaptive,adaptive@HEAD,0")
    assert out == {"off": (0, "fixed"), "K=1": (1, "fixed"),
                   "adaptive <= 3": (3, "adaptive"),
                   "adaptive <= 3@HEAD": (3, "adaptive@HEAD"),
                   "off again": (0, "fixed")}
    assert label(2, "adaptive@abc123") == "adaptive <= 2@abc123"
    with pytest.raises(SystemExit, match="more than twice"):
        settings("tiny", "1,1,1")


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_the_policy_at_a_revision_is_that_revisions_code_and_chooses():
    policy = policy_at("HEAD", 2)
    assert type(policy).__module__ != AdaptiveSpeculation.__module__
    assert policy.ks == (0, 1, 2)
    rows = [Acceptance()]
    for _ in range(12):       # every K measured once, then chosen by its rate
        k = policy.choose(rows, [100])
        policy.observe(k, 1, 0.01 * (1 + k), [(rows[0], k)] if k else [])
    assert set(policy.chosen) == {0, 1, 2}


@pytest.mark.skipif(not _in_git(), reason="needs the repository's git history")
def test_an_unknown_revision_is_an_error():
    with pytest.raises(subprocess.CalledProcessError):
        policy_at("no-such-revision", 2)
