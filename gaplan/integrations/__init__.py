"""Bridges from gaplan's plans to other training loops.

* :mod:`gaplan.integrations.transformers`: a plan as Hugging Face ``TrainingArguments``
  (``plan_training_arguments``, ``hf_snippet``) and ``GaplanTrainer``, a ``Trainer`` with
  gaplan's token-exact loss.
* :mod:`gaplan.integrations.accelerate`: ``plan_accelerator`` (a probe of your step, the accumulation steps set on
  your ``Accelerator``), ``count_step_items`` and ``step_loss`` (the token-exact loss over ``accumulate``).

Nothing heavy is imported here: each integration imports its library on first use.
"""
