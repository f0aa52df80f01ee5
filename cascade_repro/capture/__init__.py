"""Probes of the world a run starts in (git, Python packages, system, environment) → manifest sections.

A probe may answer "unavailable"; only the git probe can fail a run, because without a commit
there is nothing to restore.
"""
