"""The estimate's trust line: the zoo's measured error for the model's family, or "unmeasured"."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gaplan.estimate.trust import ZOO_ERRORS, ZOO_RUN_TO_RUN, ZOO_SIZES, model_family, trust_of

from .zoo import SIZES, zoo_configs

DOCS = Path(__file__).resolve().parents[2] / "docs" / "estimate.md"


def zoo_table() -> dict[str, dict[str, tuple[float, float]]]:
    """The zoo's table in docs/estimate.md: family -> fine-tuning -> (error at the small size, at the large)."""
    text = DOCS.read_text()
    table = text[text.index("## The zoo"):]
    rows: dict[str, dict[str, tuple[float, float]]] = {}
    for line in table.splitlines():
        match = re.match(r"\| (\w+)[^|]* \| (full|LoRA) \| ([+-][\d.]+)% \| ([+-][\d.]+)% \|", line)
        if match:
            rows.setdefault(match.group(1), {})["lora" if match.group(2) == "LoRA" else "full"] = (
                round(float(match.group(3)) / 100, 4), round(float(match.group(4)) / 100, 4))
    return rows


def test_the_docs_table_is_the_table_the_estimate_reports():
    assert ZOO_SIZES == SIZES
    assert set(ZOO_ERRORS) == set(zoo_configs())
    assert zoo_table() == {family: {kind: tuple(round(e, 4) for e in errors) for kind, errors in kinds.items()}
                           for family, kinds in ZOO_ERRORS.items()}


def test_the_run_to_run_spread_the_estimate_reports_is_the_one_the_docs_measured():
    paragraph = " ".join(DOCS.read_text().split("**Run to run.**")[1].split("\n\n")[0].split())
    assert f"moved by up to {100 * ZOO_RUN_TO_RUN:.1f} points" in paragraph


def test_a_family_in_the_zoo_reports_its_measured_error_and_how_the_run_differs():
    full = trust_of("llama", {"model": "x", "dtype": "fp32"}, "cpu")
    assert full.measured and full.errors == ZOO_ERRORS["llama"]["full"] and full.differences == ()
    low, high = sorted(full.errors)
    assert f"the zoo measured llama (full fine-tuning) within {100 * low:+.2f}% to {100 * high:+.2f}%" in full.describe()
    assert "one run: at 2 a trial's own peak moves by up to 1.0 points between runs" in full.describe()
    lora = trust_of("gpt2", {"lora": True, "dtype": "bf16", "grad_checkpointing": True}, "cuda", world_size=2)
    assert lora.errors == ZOO_ERRORS["gpt2"]["lora"]
    assert len(lora.differences) == 4 and "a CUDA target" in lora.describe() and "bf16 autocast" in lora.describe()
    assert lora.to_dict()["measured"] is True and lora.to_dict()["text"] == lora.describe()
    compiled = trust_of("llama", {"model": "x", "compile": True}, "cpu")
    assert compiled.differences == ("compiled (docs/levers.md has its checks)",)


@pytest.mark.parametrize("family, spec, words", [
    ("falcon", {}, "unmeasured: the falcon family is not in the zoo"),
    (None, {}, "unmeasured: a model without a transformers config is not in the zoo"),
    ("llama", {"lora": True, "quantize": "4bit"}, "unmeasured: llama with 4-bit weights is not in the zoo"),
])
def test_a_family_outside_the_zoo_is_unmeasured(family, spec, words):
    trust = trust_of(family, spec, "cpu")
    assert not trust.measured and trust.describe().startswith(words)


def test_the_family_is_the_configs_model_type_through_a_peft_wrapper():
    import transformers
    from peft import LoraConfig, get_peft_model

    model = transformers.GPT2LMHeadModel(zoo_configs()["gpt2"])
    assert model_family(model) == "gpt2"
    assert model_family(get_peft_model(model, LoraConfig(r=2, target_modules=["c_attn"]))) == "gpt2"
    assert model_family(object()) is None
