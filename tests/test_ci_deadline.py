"""CI's heavy run ends within its time: past GAPLAN_TEST_DEADLINE every test is a skip that says why (conftest.py)."""

import os
import subprocess
import sys

from .conftest import REPO_ROOT

ONE_TEST = "tests/runs/test_claim.py::test_run_files_are_gaplans_names_shards_and_cut_off_writes_only"


def run_one(deadline: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GAPLAN_TEST_DEADLINE"}
    if deadline is not None:
        env["GAPLAN_TEST_DEADLINE"] = deadline
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", ONE_TEST],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_a_test_past_the_deadline_is_skipped_saying_why_and_none_is_without_one():
    past = run_one("1")
    assert past.returncode == 0 and "1 skipped" in past.stdout
    assert "the CI time budget (GAPLAN_TEST_DEADLINE) is spent" in past.stdout
    assert "1 passed" in run_one(None).stdout


def test_ci_runs_the_heavy_tests_under_the_deadline():
    with open(os.path.join(REPO_ROOT, ".ci", "run"), encoding="utf-8") as handle:
        script = handle.read()
    assert "GAPLAN_TEST_DEADLINE=$((CI_STARTED + 72 * 60)) python -m pytest -q -m heavy" in script
    assert script.index("CI_STARTED=$(date +%s)") < script.index("pip install")
