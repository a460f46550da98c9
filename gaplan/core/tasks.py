"""The training tasks gaplan knows, by name, and the label value no loss counts. No torch.

What each task is (its model class, data, labels, targets and options) is its component's: :mod:`gaplan.data.tasks`.
"""

from __future__ import annotations

IGNORE_INDEX = -100  # a label position without a target (padding, unmasked MLM positions)

CAUSAL_LM = "causal-lm"
MASKED_LM = "masked-lm"
CLASSIFICATION = "classification"
SEQ2SEQ_LM = "seq2seq-lm"  # an encoder-decoder (T5, BART, Pegasus): the loss is over the decoder's target tokens
CUSTOM = "custom"  # a module:function workload: its own loss
