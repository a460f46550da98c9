"""What trains: the workload spec (model, task, dtypes, optimizer), building it, its token-exact loss, model files.

* :mod:`~gaplan.workload.spec` -- :class:`WorkloadSpec`, torch-free;
* :mod:`~gaplan.workload.build` -- the model, optimizer and batches of a spec;
* :mod:`~gaplan.workload.loss` -- ``sum / num_items_in_batch`` and target counting;
* :mod:`~gaplan.workload.model_io` -- loading pretrained weights and saving models.
"""
