"""The command line (click): parse the options, call :mod:`gaplan.workflows`, print. ``gaplan.cli.main:main``."""
