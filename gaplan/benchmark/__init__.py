"""Throughput: every split against a true large batch, and the tuner that picks by measured speed."""
