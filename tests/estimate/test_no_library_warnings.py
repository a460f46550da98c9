"""gaplan estimate and gaplan plan print no warning from the libraries' insides to a user who did nothing wrong
(torch's module tracker warned on every model whose transformers functions are wrapped as kernels' ``Func``
modules: tiny-llama's rotary embedding). Run as a user runs them, in a process of their own: its stderr is what they
see."""

import subprocess
import sys

import pytest

from tests.conftest import REPO_ROOT


@pytest.mark.slow
@pytest.mark.parametrize("command", [["estimate"], pytest.param(["plan", "--out", "{out}"], marks=pytest.mark.heavy)],
                         ids=["estimate", "plan"])
def test_estimate_and_plan_of_a_llama_preset_print_no_warning(command, tmp_path):
    args = [arg.replace("{out}", str(tmp_path / "plan")) for arg in command]
    result = subprocess.run([sys.executable, "-m", "gaplan", *args, "--model", "tiny-llama", "--target", "h100"],
                            cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "warning" not in result.stderr.lower(), result.stderr[-2000:]
