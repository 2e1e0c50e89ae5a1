"""Fixtures of the core tests: a fake registry on a loopback port (fakeregistry.py)."""

from fakeregistry import fake  # noqa: F401
