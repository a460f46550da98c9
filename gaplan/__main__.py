"""``python -m gaplan`` is the ``gaplan`` command (and what ``torchrun -m gaplan`` runs)."""

from gaplan.cli.main import run

if __name__ == "__main__":
    run()
