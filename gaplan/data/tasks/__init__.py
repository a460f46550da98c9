"""The training tasks as components: one class a task (:mod:`~gaplan.data.tasks.component`), one file each, and
the table of them by name (:mod:`~gaplan.data.tasks.registry`).

They sit on the data floor, the lowest one every user reaches: data reads the fields and builds the labels a task
names, the workload builds its model class and its fake batches, the loss counts its targets, the checks ask which
options it takes. Importing this package imports no torch (the methods that build tensors import it when called).
"""
