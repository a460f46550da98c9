"""The floor of the stack: errors, constants, task names, units, atomic writes, progress lines, the trial record.

Nothing here imports torch or any other gaplan package."""
