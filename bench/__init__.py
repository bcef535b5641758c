"""Benchmarks, each against a baseline measured in the same run."""
