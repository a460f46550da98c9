"""Which modules FSDP2 shards one by one."""

import pytest
from torch import nn

from gaplan.core.errors import GaplanError
from gaplan.parallel.fsdp import find_blocks
from gaplan.workload.build import build_workload
from gaplan.workload.spec import WorkloadSpec


@pytest.mark.parametrize("preset, count, name", [("tiny-gpt2", 4, "GPT2Block"), ("tiny-llama", 4, "LlamaDecoderLayer")])
def test_the_blocks_of_a_transformers_model_come_from_its_no_split_modules(preset, count, name):
    model = build_workload(WorkloadSpec(model=preset, seq_len=8), "meta").model
    blocks = find_blocks(model)
    assert len(blocks) == count and {type(b).__name__ for b in blocks} == {name}


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Sequential(nn.Linear(4, 4), nn.ReLU())


def test_a_custom_model_names_its_blocks_by_class_or_name_and_nested_blocks_are_not_split_off():
    model = nn.Sequential(Block(), Block(), nn.Linear(4, 2))
    model.gaplan_fsdp_blocks = [Block]
    assert find_blocks(model) == [model[0], model[1]]
    model.gaplan_fsdp_blocks = ["Block", "Sequential"]  # the inner Sequentials sit inside a Block
    assert find_blocks(model) == [model[0], model[1]]


def test_a_model_without_blocks_is_refused_with_how_to_name_them():
    with pytest.raises(GaplanError, match="gaplan_fsdp_blocks"):
        find_blocks(nn.Sequential(nn.Linear(4, 4)))
