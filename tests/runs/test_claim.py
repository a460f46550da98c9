"""A run folder holds one run and has one writer: the checks and the lock of :mod:`gaplan.runs.claim`, no torch."""

import os
import subprocess
import sys
import time

import pytest

from gaplan.core.errors import GaplanError
from gaplan.runs import folder
from gaplan.runs.claim import (
    RUN_FILE_NAMES,
    check_run_folder,
    claim_run_folder,
    hold_run_folder,
    is_temporary_write,
    remove_temporary_writes,
    run_files_in,
)

from ..conftest import REPO_ROOT


def test_every_file_the_folder_module_names_is_a_run_file():
    named = {value for name, value in vars(folder).items() if name.isupper() and isinstance(value, str)}
    assert {folder.PLAN_JSON, folder.CHECKPOINT, folder.TRAIN_JSON, folder.TRAIN_LOG_CSV, folder.REPORT_HTML,
            folder.TOKENS_JSON, folder.BENCH_JSON} <= RUN_FILE_NAMES
    assert RUN_FILE_NAMES <= named


def test_run_files_are_gaplans_names_shards_and_cut_off_writes_only(tmp_path):
    for name in ("plan.json", "notes.txt", ".checkpoint.pt.tmp.123", ".notes.txt.tmp.5", "checkpoint-shards-step4",
                 "data.jsonl", ".train_log.csv.tmp.x"):
        (tmp_path / name).write_text("x")
    assert run_files_in(str(tmp_path)) == [".checkpoint.pt.tmp.123", "checkpoint-shards-step4", "plan.json"]
    assert run_files_in(str(tmp_path / "nothing")) == []
    assert is_temporary_write(".plan.json.tmp.42") and not is_temporary_write("plan.json.tmp.42")


def test_a_folder_that_holds_a_run_is_refused_with_the_ways_on(tmp_path):
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(GaplanError, match=r"already holds a run \(plan.json\): give a fresh --out, or add --overwrite"):
        check_run_folder(str(tmp_path), "train")
    assert check_run_folder(str(tmp_path), "train", overwrite=True) == ["plan.json"]
    (tmp_path / "checkpoint.pt").write_text("x")
    with pytest.raises(GaplanError, match="continue it with gaplan train --resume"):
        check_run_folder(str(tmp_path), "train")
    for command in ("probe", "bench"):  # never into a train run, --overwrite or not
        with pytest.raises(GaplanError, match=f"a {command} never writes into one"):
            check_run_folder(str(tmp_path), command, overwrite=True)


def test_overwrite_removes_the_runs_files_and_keeps_the_users(tmp_path):
    for name in ("plan.json", "train_log.csv", "notes.txt", ".checkpoint.pt.tmp.7"):
        (tmp_path / name).write_text("x")
    (tmp_path / "checkpoint-shards-step3").mkdir()
    with claim_run_folder(str(tmp_path), "train", overwrite=True):
        assert [name for name in sorted(os.listdir(tmp_path)) if not name.startswith(".replaced.tmp.")] == ["notes.txt"]
        (tmp_path / "plan.json").write_text("the new run's")
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "plan.json"]
    assert (tmp_path / "plan.json").read_text() == "the new run's"


@pytest.mark.parametrize("writes", [False, True])
def test_a_command_refused_before_it_writes_leaves_the_run_it_would_overwrite(tmp_path, writes):
    """A mistyped option after --overwrite costs the old run nothing; a run that failed after writing has replaced
    it (as asked)."""
    for name in ("plan.json", "train.json", "notes.txt"):
        (tmp_path / name).write_text(f"old {name}")
    (tmp_path / "checkpoint-shards-step3").mkdir()
    with pytest.raises(GaplanError, match="refused"):
        with claim_run_folder(str(tmp_path), "train", overwrite=True):
            if writes:
                (tmp_path / "config.toml").write_text("new")
            raise GaplanError("refused")
    if writes:
        assert sorted(os.listdir(tmp_path)) == ["config.toml", "notes.txt"]
    else:
        assert sorted(os.listdir(tmp_path)) == ["checkpoint-shards-step3", "notes.txt", "plan.json", "train.json"]
        assert (tmp_path / "plan.json").read_text() == "old plan.json"


@pytest.mark.parametrize("wrote", [False, True])
def test_an_overwrite_killed_mid_way_leaves_the_old_run_found_again_or_replaced(tmp_path, wrote):
    """kill -9 during an --overwrite left the old run in .replaced.tmp.<pid>, where --resume, report and the refusal
    saw no run ("no checkpoint.pt in it") and the one way offered, --overwrite, deleted it. The next claim settles it
    as the killed writer would have: put back when the new run wrote nothing, else removed."""
    for name in ("train.json", "checkpoint.pt", "notes.txt"):
        (tmp_path / name).write_text(f"old {name}")
    write = f"open({str(tmp_path / 'plan.json')!r}, 'w').write('new'); " if wrote else ""
    code = (f"import sys, time; from gaplan.runs.claim import claim_run_folder; "
            f"claim = claim_run_folder({str(tmp_path)!r}, 'train', overwrite=True); claim.__enter__(); {write}"
            "print('claimed', flush=True); time.sleep(120)")
    writer = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    try:
        assert writer.stdout.readline().strip() == "claimed"
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    assert any(name.startswith(".replaced.tmp.") for name in os.listdir(tmp_path))
    deadline = time.monotonic() + 10
    while True:  # the kernel releases the lock once the process is gone
        try:
            with claim_run_folder(str(tmp_path), "train", resume=True):
                break
        except GaplanError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    if wrote:
        assert sorted(os.listdir(tmp_path)) == ["notes.txt", "plan.json"]
    else:
        assert sorted(os.listdir(tmp_path)) == ["checkpoint.pt", "notes.txt", "train.json"]
        assert (tmp_path / "train.json").read_text() == "old train.json"


def test_overwrite_refuses_to_remove_a_file_the_command_reads(tmp_path):
    (tmp_path / "plan.json").write_text("{}")
    with pytest.raises(GaplanError, match="--overwrite would remove plan.json"):
        with claim_run_folder(str(tmp_path), "train", overwrite=True, inputs=[str(tmp_path / "plan.json")]):
            pass
    assert (tmp_path / "plan.json").exists()


def test_the_resolved_path_is_checked_links_and_dot_dots(tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "checkpoint.pt").write_text("the user's own")
    os.symlink(tmp_path / "own", tmp_path / "link")
    (tmp_path / "sub").mkdir()
    for out in (tmp_path / "link", tmp_path / "sub" / ".." / "own"):
        with pytest.raises(GaplanError, match="already holds a run"):
            with claim_run_folder(str(out), "train"):
                pass
    assert (tmp_path / "own" / "checkpoint.pt").read_text() == "the user's own"


def test_a_claim_that_wrote_nothing_leaves_no_folder(tmp_path):
    with claim_run_folder(str(tmp_path / "new" / "run"), "probe"):
        assert (tmp_path / "new" / "run").is_dir()
    assert not (tmp_path / "new" / "run").exists()
    with claim_run_folder(str(tmp_path / "kept"), "probe") as real:
        (tmp_path / "kept" / "plan.json").write_text("{}")
        assert real == os.path.realpath(tmp_path / "kept")
    assert (tmp_path / "kept" / "plan.json").exists()


def test_a_nested_claim_of_the_same_folder_is_the_same_writer(tmp_path):
    """A train's --compare benches into its own folder: the inner claim neither waits for itself nor refuses."""
    with claim_run_folder(str(tmp_path), "train"):
        (tmp_path / "train.json").write_text("{}")
        with claim_run_folder(str(tmp_path), "bench"):
            (tmp_path / "bench.json").write_text("{}")
    with claim_run_folder(str(tmp_path), "train", resume=True):
        pass


def holder(path, seconds):
    """Another process that holds ``path`` for ``seconds``; returned once it holds it."""
    code = ("import sys, time\nfrom gaplan.runs.claim import hold_run_folder\n"
            f"with hold_run_folder({str(path)!r}):\n    print('held', flush=True)\n    time.sleep({seconds})\n")
    process = subprocess.Popen([sys.executable, "-c", code], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    assert process.stdout.readline().strip() == "held"
    return process


def test_a_second_writer_is_refused_naming_the_process_and_the_lock_dies_with_it(tmp_path):
    (tmp_path / "plan.json").write_text("{}")
    other = holder(tmp_path, 60)
    try:
        with pytest.raises(GaplanError, match=rf"is being written by process {other.pid} \(.*python.*\): wait for it"):
            with hold_run_folder(str(tmp_path)):
                pass
    finally:
        other.kill()  # kill -9: the kernel releases the lock, nothing stale is left
        other.wait()
    deadline = time.monotonic() + 10
    while True:
        try:
            with hold_run_folder(str(tmp_path)):
                break
        except GaplanError:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert sorted(os.listdir(tmp_path)) == ["plan.json"]


def test_cut_off_writes_are_removed_and_nothing_else(tmp_path):
    for name in (".checkpoint.pt.tmp.99999", "checkpoint.pt", ".notes.tmp.3", "notes.txt"):
        (tmp_path / name).write_text("x")
    assert remove_temporary_writes(str(tmp_path)) == [".checkpoint.pt.tmp.99999"]
    assert sorted(os.listdir(tmp_path)) == [".notes.tmp.3", "checkpoint.pt", "notes.txt"]


def test_the_run_folder_page_quotes_the_refusal_as_it_is(tmp_path, monkeypatch):
    with open(os.path.join(REPO_ROOT, "docs", "run-folder.md"), encoding="utf-8") as handle:
        page = handle.read()
    monkeypatch.chdir(tmp_path)
    os.makedirs("reports/run")
    for name in ("checkpoint.pt", "loss_check.json", "plan.json", "train.json", "train_log.csv"):
        open(os.path.join("reports/run", name), "w").close()
    with pytest.raises(GaplanError) as refusal:
        check_run_folder("reports/run", "train")
    assert f"    gaplan: {refusal.value}\n" in page


def test_a_refused_command_leaves_no_folder_it_made_but_keeps_what_another_wrote(tmp_path):
    """The folders made for ``out`` (``reports/`` under a new working folder) go when the block leaves them empty;
    a parent that holds something else stays."""
    out = tmp_path / "a" / "b" / "c"
    with pytest.raises(GaplanError, match="refused"):
        with hold_run_folder(str(out)):
            raise GaplanError("refused")
    assert os.listdir(tmp_path) == []
    with hold_run_folder(str(out)):
        (tmp_path / "a" / "note.txt").write_text("another writer's")
    assert sorted(os.listdir(tmp_path / "a")) == ["note.txt"]


def test_a_default_folder_taken_in_the_same_second_gets_the_next_number(tmp_path, monkeypatch):
    """Two runs without --out in one second named one folder: the second was refused ("already holds a run")."""
    import datetime

    from gaplan.runs.folder import default_run_dir

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("TORCHELASTIC_RUN_ID", raising=False)
    now = datetime.datetime(2026, 12, 7, 14, 11, 53)
    first = default_run_dir("train", "tiny-gpt2", now)
    assert first == os.path.join("reports", "train-tiny-gpt2-20261207-141153")
    os.makedirs(first)
    assert default_run_dir("train", "tiny-gpt2", now) == first + "-2"
    os.makedirs(first + "-2")
    assert default_run_dir("train", "tiny-gpt2", now) == first + "-3"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")  # ranks of one run: the one folder, made by any of them
    assert default_run_dir("train", "tiny-gpt2", now) == first
