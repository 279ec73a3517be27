"""DFlash drafter support; see :mod:`hf2q.models.dflash` (this module re-exports it)."""

from __future__ import annotations

from .models.dflash import *
from .models.dflash import __all__  # noqa: F401
