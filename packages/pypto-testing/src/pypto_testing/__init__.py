"""Shared test infrastructure: one place for the local hub and tiny model folders.

Several packages (and the demo) need a HuggingFace-compatible server and real model
folders; keeping them here means every test speaks to the same, tested fakes-free
implementation instead of a copy per package.
"""

__all__ = ["__version__"]

__version__ = "0.1.0"
