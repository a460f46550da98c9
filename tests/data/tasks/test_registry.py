"""The task table: its names and declarations, an unknown name's one line, and a new task added by one component
(here, in the test) reaching collate, the loss's count and the spec's check with no other change."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch

from gaplan.core.errors import GaplanError
from gaplan.core.tasks import CAUSAL_LM, CLASSIFICATION, CUSTOM, IGNORE_INDEX, MASKED_LM, SEQ2SEQ_LM
from gaplan.data import Sample, collate
from gaplan.data.tasks.component import LABEL_FIELD, LOSS_CHUNKED, TARGET_FIELD, TARGET_LEN, TASK_OPTIONS, TaskComponent
from gaplan.data.tasks.infer import infer_task, task_of_config
from gaplan.data.tasks.registry import REGISTRY, task_component, task_names, tasks_taking
from gaplan.workload.loss import count_step_targets, count_targets
from gaplan.workload.spec import WorkloadSpec


def test_the_table_holds_the_four_selectable_tasks_and_custom():
    assert task_names() == (CAUSAL_LM, MASKED_LM, CLASSIFICATION, SEQ2SEQ_LM)
    assert set(REGISTRY) == {*task_names(), CUSTOM}
    for name, component in REGISTRY.items():
        assert component.name == name
        assert component.options <= set(TASK_OPTIONS), name
        assert component.reads is None or component.reads in component.options, name
        assert (component.auto_class is not None) == component.selectable, name
    assert tasks_taking(LOSS_CHUNKED) == (CAUSAL_LM, SEQ2SEQ_LM)
    assert tasks_taking(TARGET_LEN) == tasks_taking(TARGET_FIELD) == (SEQ2SEQ_LM,)
    assert tasks_taking(LABEL_FIELD) == (CLASSIFICATION,)


def test_the_declarations_import_no_torch():
    """The torch-free readers of a task (the spec's checks, the data source's, the tokenizer's) stay torch-free."""
    code = ("import sys, gaplan.data.tasks.registry, gaplan.data.tasks.infer, gaplan.data.source, gaplan.data.tokenizer, "
            "gaplan.workload.spec; gaplan.data.tasks.registry.task_component('seq2seq-lm').options; "
            "assert 'torch' not in sys.modules, 'torch was imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_an_unknown_task_is_one_line_naming_the_choices():
    with pytest.raises(GaplanError, match=r"^unknown task 'translation'; choose one of causal-lm, masked-lm, "
                                          r"classification, seq2seq-lm$"):
        task_component("translation")


def _model(class_name: str, **config) -> object:
    return type(class_name, (), {"config": SimpleNamespace(**config)})()


def test_the_task_of_a_model_or_config_comes_from_the_components_declarations():
    assert infer_task(_model("GPT2LMHeadModel")) == CAUSAL_LM
    assert infer_task(_model("BertForMaskedLM")) == MASKED_LM
    assert infer_task(_model("Wrapped", architectures=["BertForSequenceClassification"])) == CLASSIFICATION
    assert infer_task(_model("T5Model", is_encoder_decoder=True)) == SEQ2SEQ_LM
    with pytest.raises(GaplanError, match="cannot tell the task of ResNet: pass task="):
        infer_task(_model("ResNet"))
    assert task_of_config(SimpleNamespace(architectures=["LlamaForCausalLM", "XForMaskedLM"]), CAUSAL_LM) == MASKED_LM
    assert task_of_config(SimpleNamespace(), CAUSAL_LM) == CAUSAL_LM


class _EveryToken(TaskComponent):
    """A new task as a user would add it: every real token is a target, no shift (token tagging's shape)."""

    name = "every-token"
    auto_class = "AutoModelForTokenClassification"

    def add_labels(self, batch, samples, seed, mask_id):
        batch["labels"] = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, IGNORE_INDEX)

    def fake_labels(self, ids, generator, vocab_size, num_labels, target_len):
        return ids.clone()


def test_a_new_component_is_all_a_new_task_needs(monkeypatch):
    monkeypatch.setitem(REGISTRY, _EveryToken.name, _EveryToken())
    assert task_names()[-1] == "every-token"
    batch = collate([Sample((5, 6, 7)), Sample((8, 9))], "every-token")
    assert batch["labels"].tolist() == [[5, 6, 7], [8, 9, IGNORE_INDEX]]
    assert count_targets(batch, "every-token") == 5 and count_targets(batch, CAUSAL_LM) == 3  # no shift, unlike causal
    assert count_step_targets([batch, batch], "every-token") == 10
    assert WorkloadSpec(task="every-token").validate().task == "every-token"
    with pytest.raises(GaplanError, match="target_len applies to seq2seq-lm models; .* trains as every-token"):
        WorkloadSpec(task="every-token", target_len=8).validate()
    assert torch.equal(_EveryToken().fake_labels(batch["input_ids"], None, 10, 2, None), batch["input_ids"])
