"""Argument parsing and printing, one module per command group; `builder.cli` dispatches."""
