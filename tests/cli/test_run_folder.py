"""A run folder is never lost (issue 54): no silent overwrite, one writer at a time, a resume that checks before it
writes, signals that end every command alike, refusals that name the file and key. Each refused command leaves every
file of the folder byte-identical."""

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest
import torch
from click.testing import CliRunner

from gaplan.cli.main import main

from ..conftest import REPO_ROOT, free_port

TRAIN = ["train", "--seq-len", "16", "--effective-batch", "8", "--micro-batch", "4", "--optimizer", "sgd",
         "--lr", "0.01", "--threads", "1", "--quiet"]


def snapshot(folder):
    """Every file under ``folder``, by path, with its bytes' digest."""
    files = {}
    for root, _, names in os.walk(folder):
        for name in names:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                files[os.path.relpath(path, folder)] = hashlib.sha256(handle.read()).hexdigest()
    return files


def gaplan(*args):
    return CliRunner().invoke(main, list(args))


def refused(result, *fragments):
    """Exit 2 with one line on stderr holding each fragment."""
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2, result.output
    assert len(lines) == 1 and lines[0].startswith("gaplan: "), result.stderr
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def train_into(root, name, *extra):
    result = gaplan(*TRAIN, "--steps", "1", "--out", str(root / name), *extra)
    assert result.exit_code == 0, result.output
    return root / name


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 1-step run of tiny-gpt2 at seq 16."""
    return train_into(tmp_path_factory.mktemp("runs"), "run").parent


@pytest.fixture(scope="module")
def other_runs(tmp_path_factory):
    """Checkpoints of two other runs: tiny-llama, and tiny-gpt2 at seq 32."""
    root = tmp_path_factory.mktemp("others")
    train_into(root, "llama", "--model", "tiny-llama")
    train_into(root, "seq32", "--seq-len", "32")
    (root / "d.jsonl").write_text("".join(json.dumps({"text": f"line {i} of the corpus"}) + "\n" for i in range(32)))
    train_into(root, "data", "--data", str(root / "d.jsonl"), "--tokenizer", "bytes")
    return root


@pytest.fixture
def run(trained, tmp_path):
    """A fresh copy of the trained run, to be refused into."""
    shutil.copytree(trained / "run", tmp_path / "run")
    return tmp_path / "run"


@pytest.mark.slow
def test_an_out_that_holds_a_run_is_refused_by_every_command_and_nothing_changes(run, tmp_path):
    before = snapshot(run)
    (tmp_path / "sub").mkdir()
    for out in (str(run), str(tmp_path / "sub" / ".." / "run")):
        refused(gaplan(*TRAIN, "--steps", "1", "--out", out), "already holds a run", f"--resume {out}", "--overwrite")
    refused(gaplan("probe", "--seq-len", "16", "--out", str(run)), "holds a train run", "a probe never writes into one")
    refused(gaplan("bench", "--seq-len", "16", "--out", str(run), "--overwrite"), "a bench never writes into one")
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_link_to_the_users_own_checkpoint_is_refused(tmp_path):
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "checkpoint.pt").write_bytes(b"the user's own")
    os.symlink(tmp_path / "mine", tmp_path / "link")
    refused(gaplan(*TRAIN, "--steps", "1", "--out", str(tmp_path / "link")), "already holds a run (checkpoint.pt)")
    assert (tmp_path / "mine" / "checkpoint.pt").read_bytes() == b"the user's own"


@pytest.mark.slow
def test_overwrite_replaces_the_run_whole_and_keeps_the_users_files(run):
    (run / "notes.txt").write_text("mine")
    (run / "report.md").write_text("the old run's report")
    result = gaplan(*TRAIN, "--steps", "2", "--out", str(run), "--overwrite", "--json")
    assert result.exit_code == 0, result.output
    assert (run / "notes.txt").read_text() == "mine"
    assert not (run / "report.md").exists()  # the old run's: gone, not left beside the new one
    log = (run / "train_log.csv").read_text().splitlines()
    assert [line.split(",")[0] for line in log[1:]] == ["1", "2"]
    assert json.loads((run / "train.json").read_text())["options"]["steps"] == 2
    assert torch.load(run / "checkpoint.pt", weights_only=True, mmap=True)["step"] == 2
    refused(gaplan(*TRAIN, "--resume", str(run), "--overwrite"), "--overwrite replaces a run and --resume continues one")
    before = {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()}
    refused(gaplan(*TRAIN, "--steps", "2", "--out", str(run), "--overwrite", "--device", "tpu"), "--device must be")
    assert {path.name: path.read_bytes() for path in run.iterdir() if path.is_file()} == before  # refused: kept


@pytest.mark.heavy
@pytest.mark.slow
def test_a_second_writer_is_refused_while_a_run_trains(tmp_path):
    """A real second writer: ``--resume`` of a run that is still training, and the same command started again."""
    live = tmp_path / "live"
    first = subprocess.Popen([sys.executable, "-m", "gaplan", *TRAIN, "--steps", "400", "--checkpoint-every", "1",
                              "--out", str(live)], cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 120
        while not (live / "checkpoint.pt").exists():
            assert first.poll() is None and time.monotonic() < deadline, first.stderr.read()
            time.sleep(0.05)
        # each named by the flag given (a resume's: --resume, and no "give another --out" it cannot take)
        line = refused(gaplan("train", "--resume", str(live), "--steps", "401"),
                       f"--resume {live} is being written by process {first.pid}", "wait for it to end")
        assert "another" not in line, line
        refused(gaplan(*TRAIN, "--out", str(live)), f"--out {live} is being written by process {first.pid}",
                "wait for it to end, or give another --out")
    finally:
        first.send_signal(signal.SIGTERM)  # it checkpoints and stops
        assert first.wait(timeout=120) == 130
        first.stdout.close()
        first.stderr.close()
    steps = [line.split(",")[0] for line in (live / "train_log.csv").read_text().splitlines()[1:]]
    assert steps == [str(n) for n in range(1, len(steps) + 1)]  # one line a step, in order
    assert torch.load(live / "checkpoint.pt", weights_only=True, mmap=True)["step"] == len(steps)
    assert json.loads((live / "train.json").read_text())["options"]["steps"] == 400


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("other, says", [("llama", "its model is 'tiny-llama', train.json's 'tiny-gpt2'"),
                                         ("seq32", "its seq_len is 32, train.json's 16"),
                                         ("data", "its data is '")])
def test_a_checkpoint_of_another_run_is_refused_before_anything_is_written(run, other_runs, other, says):
    shutil.copy(other_runs / other / "checkpoint.pt", run / "checkpoint.pt")
    before = snapshot(run)
    refused(gaplan("train", "--resume", str(run), "--steps", "2"), "checkpoint.pt is not this run's", says)
    assert snapshot(run) == before


@pytest.mark.slow
@pytest.mark.parametrize("damage, says", [
    ("model", "does not fit the model train.json names: transformer.wte.weight is [64, 256] in it, [8192, 256] in the model"),
    ("optimizer", "its optimizer holds"),
])
def test_a_checkpoint_whose_tensors_do_not_fit_the_model_is_refused_before_anything_is_written(run, damage, says):
    state = torch.load(run / "checkpoint.pt", weights_only=True)
    if damage == "model":
        state["model"]["transformer.wte.weight"] = state["model"]["transformer.wte.weight"][:64].clone()
    else:
        state["optimizer"]["param_groups"][0]["params"] = state["optimizer"]["param_groups"][0]["params"][:-1]
    torch.save(state, run / "checkpoint.pt")
    before = snapshot(run)
    refused(gaplan("train", "--resume", str(run), "--steps", "2"), says)
    assert snapshot(run) == before


@pytest.mark.slow
def test_a_write_cut_off_by_a_kill_is_removed_once_the_checkpoint_loads(run):
    (run / ".checkpoint.pt.tmp.99999").write_bytes(b"half a checkpoint")
    refused(gaplan("train", "--resume", str(run), "--steps", "0"), "--steps")  # refused: nothing is touched
    assert (run / ".checkpoint.pt.tmp.99999").exists()
    result = gaplan("train", "--resume", str(run), "--steps", "2", "--loss", "chunked")
    assert result.exit_code == 0, result.output
    assert not (run / ".checkpoint.pt.tmp.99999").exists()
    # --loss is a memory setting on resume (both losses are token-exact): taken, and said as a new split
    assert "resumed on a new split (loss changed)" in result.stderr
    assert json.loads((run / "train.json").read_text())["workload"]["loss"] == "chunked"


@pytest.mark.parametrize("record, said", [
    ({"workload": {"model": "tiny-gpt2"}, "options": {"steps": -3}}, '"options"."steps"'),
    # a bad workload value is named by its key too (it was blamed on the checkpoint: "its seq_len is 16, train.json's
    # 'abc' (a checkpoint of another run, copied in?)")
    ({"workload": {"model": "tiny-gpt2", "seq_len": "abc"}, "options": {}},
     '"workload"."seq_len" must be an integer of at least 2 (got \'abc\')'),
    ({"workload": {"model": "tiny-gpt2", "dtype": "fp8"}, "options": {}}, "unknown dtype 'fp8'"),
])
def test_a_bad_value_in_train_json_is_named_by_its_key_not_a_flag(tmp_path, record, said):
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "train.json").write_text(json.dumps(record))
    line = refused(gaplan("train", "--resume", str(tmp_path)), f"train.json holds a value that cannot be used: {said}")
    assert "--steps" not in line and "--seq-len" not in line


@pytest.mark.parametrize("record, said", [
    ({"workload": {"model": "tiny-gpt2"}}, "no 'options' in it"),
    ([], "not the JSON object train writes"),
])
def test_a_train_json_of_another_shape_says_what_a_record_holds_not_a_python_error(tmp_path, record, said):
    (tmp_path / "checkpoint.pt").write_bytes(b"")
    (tmp_path / "train.json").write_text(json.dumps(record))
    line = refused(gaplan("train", "--resume", str(tmp_path)), f"train.json is not a gaplan train record ({said}")
    assert "Error" not in line, line


def test_a_link_that_loops_is_said_so(tmp_path):
    os.symlink(tmp_path / "a", tmp_path / "b")
    os.symlink(tmp_path / "b", tmp_path / "a")
    refused(gaplan(*TRAIN, "--data", str(tmp_path / "a"), "--out", str(tmp_path / "out")), "a symbolic link that loops")
    refused(gaplan("train", "--resume", str(tmp_path / "a")), "--resume", "a symbolic link that loops")
    assert sorted(os.listdir(tmp_path)) == ["a", "b"]


@pytest.mark.slow
@pytest.mark.parametrize("ramp", [1000, 2])  # a ramp over all of the run's steps never reaches the top either
def test_a_warmup_longer_than_the_run_is_said_in_one_line(tmp_path, ramp):
    loud = [arg for arg in TRAIN if arg != "--quiet"]
    result = gaplan(*loud, "--effective-batch", "16", "--batch-schedule", f"warmup:{ramp}", "--steps", "2",
                    "--out", str(tmp_path / "w"))
    assert result.exit_code == 0, result.output
    assert (f"batch schedule warmup:{ramp} ramps over the run's 2 steps or more: it ends at effective batch "
            f"{4 if ramp == 1000 else 8}, not 16 (--steps {ramp + 1} or more reaches it)") in result.stderr


def signalled(args, sig, after_line, delay, out):
    """``gaplan ARGS`` in its own process group, sent ``sig`` ``delay`` s after its stderr shows ``after_line``."""
    process = subprocess.Popen([sys.executable, "-m", "gaplan", *args, "--out", str(out)], cwd=REPO_ROOT,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    lines = []
    for line in process.stderr:
        lines.append(line)
        if after_line in line:
            break
    time.sleep(delay)
    os.killpg(process.pid, sig)  # as a terminal's Ctrl-C does: to the whole group, trial workers included
    out_text, rest = process.communicate(timeout=120)
    return process.returncode, "".join(lines) + rest, out_text


PROBE = ["probe", "--seq-len", "16", "--memory-limit", "256MiB", "--threads", "1", "--no-seed-from-estimate"]


MOMENTS = [("probing", 0.0), ("probing", 1.0), ("micro-batch", 0.2)]
SIGNALS_AT = [pytest.param(sig, after, delay, marks=[] if (sig, delay) == (signal.SIGTERM, 0.0) else [pytest.mark.heavy],
                           id=f"{signal.Signals(sig).name.lower()}-{name}")
              for sig in (signal.SIGINT, signal.SIGTERM)
              for (after, delay), name in zip(MOMENTS, ("at-the-workers-start", "a-second-in", "between-trials"),
                                              strict=True)]


@pytest.mark.slow
@pytest.mark.parametrize("sig, after, delay", SIGNALS_AT)
def test_a_signal_ends_a_probe_in_one_line_and_writes_nothing(tmp_path, sig, after, delay):
    code, err, out = signalled(PROBE, sig, after, delay, tmp_path / "p")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == f"gaplan: interrupted ({signal.Signals(sig).name})", err
    assert "Traceback" not in err and out == ""
    assert not (tmp_path / "p").exists()  # nothing half-written: not even the folder


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["sigint", "sigterm"])
def test_a_signal_ends_a_bench_in_one_line(tmp_path, sig):
    code, err, _ = signalled(["bench", "--seq-len", "16", "--memory-limit", "256MiB", "--effective-batch", "8",
                              "--threads", "1"], sig, "", 2.0, tmp_path / "b")
    assert code == 130, err
    assert err.strip().splitlines()[-1] == f"gaplan: interrupted ({signal.Signals(sig).name})", err
    assert "Traceback" not in err


@pytest.mark.heavy
@pytest.mark.slow
@pytest.mark.distributed
def test_a_refusal_under_torchrun_is_one_line_and_the_root_cause_of_torchruns_summary(run):
    """What docs/resume.md says the user sees: rank 0's line, then torchrun's summary naming it as the root cause."""
    before = snapshot(run)
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "3", "--master-port",
                           str(free_port()), "-m", "gaplan", "train", "--resume", str(run), "--steps", "2"],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1  # torchrun's own exit status for a failed rank
    line = "gaplan: effective batch 8 is not divisible by the world size 3"
    assert [text for text in done.stderr.splitlines() if text.startswith("gaplan:")] == [line]
    root_cause = done.stderr.split("Root Cause")[1]
    assert f"traceback : {line}" in root_cause and "exitcode  : 2" in root_cause
    with open(os.path.join(REPO_ROOT, "docs", "run-folder.md"), encoding="utf-8") as handle:
        page = handle.read()
    assert f"    {line}\n" in page and f"      traceback : {line}\n" in page and "Root Cause (first observed" in page
    assert snapshot(run) == before


def test_report_refuses_a_folder_a_run_is_writing(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"model": "tiny-gpt2", "plan": {"effective_batch": 8}}))
    holding = subprocess.Popen([sys.executable, "-c", "import time\nfrom gaplan.runs.claim import hold_run_folder\n"
                                f"with hold_run_folder({str(tmp_path)!r}):\n    print('held', flush=True)\n"
                                "    time.sleep(60)\n"], cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True)
    try:
        assert holding.stdout.readline().strip() == "held"
        refused(gaplan("report", str(tmp_path)), f"run folder {tmp_path} is being written by process {holding.pid}")
    finally:
        holding.kill()
        holding.wait()
        holding.stdout.close()


@pytest.mark.slow
def test_report_refuses_a_log_that_two_runs_wrote(run):
    log = (run / "train_log.csv").read_text().splitlines()
    (run / "train_log.csv").write_text("\n".join([*log, log[1]]) + "\n")  # step 1 again after step 1
    refused(gaplan("report", str(run)), "train_log.csv is not one run's log: step 1 follows step 1")


@pytest.mark.parametrize("args, status", [(["--version"], 0), (["report", "/no/such/run"], 2)])
def test_a_signal_during_the_teardown_keeps_the_commands_exit_status(args, status):
    """A SIGTERM after the result was out (here from an atexit hook, so it lands in the interpreter's teardown) ended
    the process as the signal's default does: exit 143, no line, for a command that had finished."""
    hook = ("import atexit, os, signal, sys; atexit.register(lambda: os.kill(os.getpid(), signal.SIGTERM)); "
            f"sys.argv = ['gaplan', *{args!r}]; from gaplan.cli.main import run; run()")
    done = subprocess.run([sys.executable, "-c", hook], cwd=REPO_ROOT, capture_output=True, text=True, timeout=60,
                          env=dict(os.environ, PYTHONPATH=REPO_ROOT))
    assert done.returncode == status, (done.returncode, done.stderr[-2000:])
    assert "Traceback" not in done.stderr
