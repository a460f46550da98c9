"""A ``module:function`` model whose own code fails is one line naming it (exit 2), not gaplan's traceback; an
out-of-memory error in it stays one, for the probe to read as the edge."""

import sys

import pytest
from click.testing import CliRunner

from gaplan.cli.main import main
from gaplan.core.errors import GaplanError
from gaplan.workload.function_model import made_by_function

MODULE = '''
import torch

def raises():
    raise ValueError("my model factory is broken")

def out_of_memory():
    raise MemoryError()

def batch_maker_is_a_number():
    return torch.nn.Linear(4, 4), 5

def loss_is_text():
    return torch.nn.Linear(4, 4), lambda b: {"x": torch.zeros(b, 4)}, "mse"
'''


@pytest.fixture
def user_modules(tmp_path, monkeypatch):
    (tmp_path / "usermodels.py").write_text(MODULE)
    (tmp_path / "broken_syntax.py").write_text("def make(:\n")
    monkeypatch.chdir(tmp_path)
    yield
    for name in ("usermodels", "broken_syntax"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("target, message", [
    ("usermodels:raises", "model 'usermodels:raises' raised ValueError: my model factory is broken"),
    ("usermodels:batch_maker_is_a_number", "returned a workload, but its make_batch is not callable"),
    ("usermodels:loss_is_text", "returned a workload, but its loss is not callable"),
    ("broken_syntax:make", "model 'broken_syntax:make': importing broken_syntax raised SyntaxError: invalid syntax"),
])
def test_a_function_models_own_failure_is_one_line_naming_it(user_modules, target, message):
    with pytest.raises(GaplanError) as caught:
        made_by_function(target)
    assert str(caught.value).startswith(message) or message in str(caught.value)
    assert "--" not in str(caught.value)  # a Python caller gave no flag: the message names none
    result = CliRunner().invoke(main, ["estimate", "--model", target, "--device", "cpu", "--quiet"])
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    # where the user's code raised, the command line points to --debug, which prints that code's traceback
    hint = " (--debug shows the traceback)" if "raised" in message else ""
    assert result.exit_code == 2 and lines == [f"gaplan: {caught.value}{hint}"], result.output


def test_debug_shows_the_users_code_where_it_raised_in_a_trials_process(user_modules):
    """A probe builds a function's model in its trial worker: the traceback comes back with the error."""
    args = ["probe", "--model", "usermodels:raises", "--memory-limit", "256MiB", "--device", "cpu", "--quiet"]
    result = CliRunner().invoke(main, ["--debug", *args])
    assert result.exit_code == 2
    assert 'usermodels.py", line 5, in raises' in result.stderr and "ValueError: my model factory is broken" in result.stderr
    last = result.stderr.rstrip().splitlines()[-1]
    assert last == "gaplan: model 'usermodels:raises' raised ValueError: my model factory is broken"


def test_an_out_of_memory_error_in_the_function_stays_one(user_modules):
    with pytest.raises(MemoryError):
        made_by_function("usermodels:out_of_memory")
