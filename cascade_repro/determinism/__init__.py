"""Determinism: tensor fingerprints (used in the child), step traces, and comparing two runs."""
