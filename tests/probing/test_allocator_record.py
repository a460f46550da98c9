"""The CUDA allocator's setting (``PYTORCH_CUDA_ALLOC_CONF``, ``PYTORCH_ALLOC_CONF``) is part of the measurement:
the trials inherit it, the plan and the report record it, and ``gaplan train`` warns in one line when its own
setting is not its plan's. (The cache key holds it too: ``test_cache_key.py``.)
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from gaplan.core.errors import GaplanError
from gaplan.devices.cpu import budget_environment, native_environment
from gaplan.probing.cache import probe_for
from gaplan.report import write_report
from gaplan.runs.probe_result import ALLOCATOR_VARIABLES, allocator_warning, load_probe, save_probe
from tests.probing.test_cache import SPEC, probe_result
from tests.report.runs import TRIALS, make_run, plan_json

EXPANDABLE = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}


@pytest.fixture(autouse=True)
def no_setting(monkeypatch):
    for name in ALLOCATOR_VARIABLES:
        monkeypatch.delenv(name, raising=False)


def test_the_plan_records_the_setting_its_trials_ran_under(tmp_path, monkeypatch):
    assert probe_result(8).allocator == {}  # none set: torch's defaults, recorded as such
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    monkeypatch.setenv("PYTORCH_ALLOC_CONF", "garbage_collection_threshold:0.6")
    made = probe_result(8)
    assert made.allocator == {**EXPANDABLE, "PYTORCH_ALLOC_CONF": "garbage_collection_threshold:0.6"}
    save_probe(made, str(tmp_path / "plan.json"))
    assert json.loads((tmp_path / "plan.json").read_text())["allocator_setting"] == made.allocator
    monkeypatch.delenv("PYTORCH_ALLOC_CONF")
    assert load_probe(str(tmp_path / "plan.json")).allocator == made.allocator  # the file's, not this process's


def test_a_plan_from_before_the_record_is_not_given_this_processs_setting(tmp_path, monkeypatch):
    data = probe_result(8).to_dict()
    del data["allocator_setting"]
    (tmp_path / "old.json").write_text(json.dumps(data))
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    assert load_probe(str(tmp_path / "old.json")).allocator is None  # not recorded, not guessed
    (tmp_path / "bad.json").write_text(json.dumps(dict(data, allocator_setting="expandable_segments:True")))
    with pytest.raises(GaplanError, match="allocator_setting must be a JSON object of strings"):
        load_probe(str(tmp_path / "bad.json"))


def test_the_trials_inherit_the_setting():
    """A probe's worker and a spawned trial get budget_environment(os.environ); a timed run native_environment."""
    environ = {"PATH": "/bin", **EXPANDABLE, "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}
    for child in (budget_environment(environ), native_environment(environ, set())):
        assert {name: child[name] for name in ALLOCATOR_VARIABLES} == {name: environ[name]
                                                                      for name in ALLOCATOR_VARIABLES}


def _plan_file(tmp_path, allocator, device="cuda:0") -> str:
    path = str(tmp_path / "plan.json")
    save_probe(dataclasses.replace(probe_result(9), device=device, allocator=allocator), path)
    return path


def test_train_warns_in_one_line_when_its_setting_is_not_the_plans(tmp_path, monkeypatch):
    lines: list[str] = []
    probe_for(SPEC, "cuda:0", None, 32, plan_file=_plan_file(tmp_path, EXPANDABLE), say=lines.append)
    assert len(lines) == 1 and "\n" not in lines[0]
    assert lines[0].startswith("warning: this run's CUDA allocator setting (PYTORCH_CUDA_ALLOC_CONF unset (torch's "
                               "defaults)) is not the plan's (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True)")
    monkeypatch.setenv("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:True")
    probe_for(SPEC, "cuda:0", None, 32, plan_file=_plan_file(tmp_path, EXPANDABLE), say=lines.append)
    assert len(lines) == 1  # the same setting: nothing to say


@pytest.mark.parametrize("device, recorded", [("cpu", EXPANDABLE), ("cuda:0", None)])
def test_no_warning_where_the_setting_cannot_matter_or_was_not_recorded(tmp_path, device, recorded):
    lines: list[str] = []
    probe_for(SPEC, device, None, 32, plan_file=_plan_file(tmp_path, recorded, device), say=lines.append)
    assert lines == []
    assert allocator_warning(probe_result(9), "cuda:0", environ=EXPANDABLE) is not None  # and the check itself


@pytest.mark.parametrize("device, setting, line", [
    ("cuda:0", EXPANDABLE, "**CUDA allocator:** PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True\n"),
    ("cuda:0", {}, "**CUDA allocator:** PYTORCH_CUDA_ALLOC_CONF unset (torch's defaults)\n"),
    ("cuda:0", None, "**CUDA allocator:** allocator setting not recorded\n"),
    ("cpu", EXPANDABLE, "**CUDA allocator:** PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (no effect on a CPU "
                        "run)\n"),
    ("cpu", {}, None),
])
def test_the_report_carries_the_setting(tmp_path, device, setting, line):
    data = dict(plan_json(TRIALS), device=device)
    if setting is not None:
        data["allocator_setting"] = setting
    write_report(str(make_run(tmp_path, full=False, plan=data)))
    text = (tmp_path / "report.md").read_text(encoding="utf-8")
    if line is None:
        assert "CUDA allocator" not in text
    else:
        assert line in text and text.count("CUDA allocator") == 1
