"""A run folder on disk: its file names, the CSV/JSON schema, and the saved probe result. Torch-free."""
