"""Bridges from gaplan's plans to other training loops.

* :mod:`gaplan.integrations.transformers`: a plan as Hugging Face ``TrainingArguments``
  (``plan_training_arguments``, ``hf_snippet``) and ``GaplanTrainer``, a ``Trainer`` with
  gaplan's token-exact loss (``GaplanSeq2SeqTrainer``: the same over ``Seq2SeqTrainer``).
* :mod:`gaplan.integrations.accelerate`: ``plan_accelerator`` (a probe of your step and optimizer step, the plan at
  B*; your ``Accelerator`` left as it is), ``count_step_items`` and ``step_loss`` (the token-exact loss over
  ``accumulate``).
* :mod:`gaplan.integrations.lightning`: ``GaplanBatchSize``, a callback that probes your LightningModule's step and
  sets its batch size and ``accumulate_grad_batches`` (``uneven=True``: the plan at B* through
  ``loader_options``); :mod:`gaplan.integrations.lightning_loss`: ``TokenExactLoss``.

Nothing heavy is imported here: each integration imports its library when it is imported itself.
"""
