"""gaplan with accelerate: the plan set on the Accelerator from a probe of the user's own step, and the token-exact
loss over ``accelerator.accumulate``, in one process and over two DDP ranks."""

import pytest
import torch

accelerate = pytest.importorskip("accelerate")

from gaplan.data import SyntheticCorpus, collate  # noqa: E402
from gaplan.integrations.accelerate import count_step_items, plan_accelerator, step_loss  # noqa: E402
from gaplan.workload.loss import summed_token_loss  # noqa: E402
from tests.conftest import SMALL_BUDGET  # noqa: E402

TASK = "causal-lm"


@pytest.fixture(autouse=True)
def fresh_accelerator_state():
    """accelerate keeps one state per process; each test makes its own Accelerator."""
    from accelerate.state import AcceleratorState, GradientState

    AcceleratorState._reset_state(True)
    GradientState._reset_state()
    yield
    AcceleratorState._reset_state(True)
    GradientState._reset_state()


def tiny_model():
    from transformers import AutoModelForCausalLM, GPT2Config

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32, bos_token_id=0,
                        eos_token_id=0, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    return AutoModelForCausalLM.from_config(config)


def gradients(model):
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def test_the_recipe_gives_the_gradient_of_one_full_batch_on_padded_uneven_micro_batches():
    corpus = SyntheticCorpus(32, seed=0)  # lengths from 8 to 32: every micro-batch pads, and differently
    samples = [corpus[i] for i in range(11)]
    sizes = (4, 4, 3)  # an uneven split of 11
    reference = tiny_model()
    whole = collate(samples, TASK)
    (summed_token_loss(reference(**whole).logits, whole, TASK) / (whole["labels"][:, 1:] != -100).sum()).backward()
    expected = gradients(reference)

    accelerator = accelerate.Accelerator(cpu=True, gradient_accumulation_steps=len(sizes))
    model = tiny_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)  # lr 0: the weights stay, the gradients are kept
    model, optimizer = accelerator.prepare(model, optimizer)
    starts = [sum(sizes[:i]) for i in range(len(sizes))]
    micro_batches = [collate(samples[s:s + n], TASK) for s, n in zip(starts, sizes, strict=True)]
    items = count_step_items(accelerator, micro_batches, TASK)
    assert items == int((whole["labels"][:, 1:] != -100).sum())
    got = None
    for batch in micro_batches:
        with accelerator.accumulate(model):
            accelerator.backward(step_loss(accelerator, summed_token_loss(model(**batch).logits, batch, TASK), items))
            if accelerator.sync_gradients:
                got = gradients(accelerator.unwrap_model(model))
            optimizer.step()
            optimizer.zero_grad()
    assert got is not None and set(got) == set(expected)
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-7, msg=name)

    # What accelerate's own loop does (each micro-batch's mean loss, divided by the steps) is not that gradient.
    naive = tiny_model()
    for batch in micro_batches:
        (naive(**batch).loss / len(sizes)).backward()
    worst = max(((gradients(naive)[n] - g).abs().max() / g.abs().max()).item() for n, g in expected.items())
    assert worst > 1e-3


@pytest.mark.slow
def test_plan_accelerator_probes_the_users_step_under_its_mixed_precision_and_sets_the_accumulation():
    accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")

    def setup():
        model = tiny_model()
        return model, torch.optim.AdamW(model.parameters())

    def make_batch(size):
        return torch.randint(1, 256, (size, 32))

    def micro_step(model, ids):
        assert torch.is_autocast_enabled("cpu"), "the probe must run the step as the Accelerator trains it"
        model(input_ids=ids, labels=ids).loss.backward()

    result = plan_accelerator(accelerator, setup, make_batch, micro_step, effective_batch=64,
                              memory_limit=SMALL_BUDGET, threads=1)
    assert result.max_micro_batch >= 1 and result.plan.effective_batch == 64
    assert accelerator.gradient_accumulation_steps == result.plan.grad_accum_steps >= 1
    assert result.plan.micro_batch <= result.max_micro_batch and result.plan.is_even
    assert result.plan.micro_batch * result.plan.grad_accum_steps == 64
    fits = [t for t in result.trials if t.fits]
    assert max(t.micro_batch for t in fits) == result.max_micro_batch
    assert result.capped or any(not t.fits and t.micro_batch == result.max_micro_batch + 1 for t in result.trials)


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.heavy
def test_the_recipe_over_two_ddp_ranks_gives_the_gradient_of_both_ranks_samples_as_one_batch():
    """torchrun, 2 CPU ranks (gloo): each rank's 7 padded samples as 3 + 2 + 2; the synced gradient is that of all 14
    as one batch (the step's targets counted over both ranks). Then plan_accelerator inside the launch, and one step
    at its planned split, exact as well."""
    import json
    import os
    import subprocess
    import sys

    from tests.conftest import REPO_ROOT, free_port

    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
                           str(free_port()), os.path.join(REPO_ROOT, "tests", "scripts", "accelerate_ddp.py")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["world"] == 2 and result["items"] == result["targets"]
    assert result["worst"] < 1e-5, result
    # plan_accelerator from inside the launch: both ranks take rank 0's probe; one step at its split is exact too
    assert 1 <= result["micro_batch"] <= result["edge"] < 32, result  # the budget binds below a rank's share
    assert result["micro_batch"] * result["accumulation"] * result["world"] == 64
    assert result["accelerator_steps"] == result["accumulation"] > 1
    assert result["planned_worst"] < 1e-5, result


def _bf16_micro_step(model, batch):
    return model(batch).dtype


def test_the_step_goes_to_a_spawned_trial_with_the_accelerators_autocast_not_the_accelerator():
    """Where the process cannot fork, the step is pickled: it carries torch.autocast's arguments as accelerate chose
    them (bf16 here), and autocasts with them in the new process as accelerator.autocast() does."""
    import pickle

    from gaplan.integrations.accelerate import AutocastStep, accelerator_autocast

    accelerator = accelerate.Accelerator(cpu=True, mixed_precision="bf16")
    step = pickle.loads(pickle.dumps(AutocastStep(_bf16_micro_step, accelerator_autocast(accelerator))))
    assert step.autocast["device_type"] == "cpu" and step.autocast["dtype"] == torch.bfloat16
    assert step(torch.nn.Linear(4, 4), torch.randn(2, 4)) == torch.bfloat16
    with accelerator.autocast():
        assert _bf16_micro_step(torch.nn.Linear(4, 4), torch.randn(2, 4)) == torch.bfloat16
    accelerate.state.AcceleratorState._reset_state(True)
    assert accelerator_autocast(accelerate.Accelerator(cpu=True)) is None  # no mixed precision: no autocast
