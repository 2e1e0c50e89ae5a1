"""Benchmarks of the pipeline against a naive Dockerfile and syft: `python -m bench [--full]`."""
