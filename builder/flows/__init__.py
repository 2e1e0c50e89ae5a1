"""Compositions of stages: `rebuild` (the scheduled security rebuild) and `verify`."""
