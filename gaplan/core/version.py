"""The package version, importable from anywhere in the stack without importing ``gaplan``'s API."""

__version__ = "0.1.0"
