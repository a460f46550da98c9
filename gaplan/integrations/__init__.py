"""Bridges from gaplan's plans to other training loops.

* :mod:`gaplan.integrations.transformers`: a plan as Hugging Face ``TrainingArguments``
  (``plan_training_arguments``, ``hf_snippet``) and ``GaplanTrainer``, a ``Trainer`` with
  gaplan's token-exact loss.

Nothing heavy is imported here: each integration imports its library on first use.
"""
