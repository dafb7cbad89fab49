"""Sampling: the decode loop, the Python API's Generator, constraints, named forms, and translation."""
