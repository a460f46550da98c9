"""The training tasks gaplan knows, by name, and the label value no loss counts. No torch."""

from __future__ import annotations

from typing import Any

from gaplan.core.errors import GaplanError

IGNORE_INDEX = -100  # a label position without a target (padding, unmasked MLM positions)

CAUSAL_LM = "causal-lm"
MASKED_LM = "masked-lm"
CLASSIFICATION = "classification"
SEQ2SEQ_LM = "seq2seq-lm"  # an encoder-decoder (T5, BART, Pegasus): the loss is over the decoder's target tokens
CUSTOM = "custom"  # a module:function workload: its own loss
TASKS = (CAUSAL_LM, MASKED_LM, CLASSIFICATION, SEQ2SEQ_LM)


def infer_task(model: Any) -> str:
    """gaplan's task for a transformers model, from its class name (PEFT wrappers are looked through): read by
    class name, no transformers import. The integrations share it from here."""
    base = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    if getattr(getattr(base, "config", None), "is_encoder_decoder", False):
        return SEQ2SEQ_LM
    names = [type(base).__name__, *(getattr(getattr(base, "config", None), "architectures", None) or [])]
    for name in names:
        if name.endswith("ForMaskedLM"):
            return MASKED_LM
        if name.endswith("ForSequenceClassification"):
            return CLASSIFICATION
        if name.endswith(("ForCausalLM", "LMHeadModel")):
            return CAUSAL_LM
    raise GaplanError(f"cannot tell the task of {type(base).__name__}: pass task= (one of {', '.join(TASKS)})")
