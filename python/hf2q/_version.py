"""The package version: the one place it is written (pyproject.toml reads it
from here at build time, so ``import hf2q`` needs no importlib.metadata)."""

__version__ = "0.1.0"
