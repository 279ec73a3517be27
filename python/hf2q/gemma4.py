"""``import hf2q.gemma4``: re-exports :mod:`hf2q.models.gemma4`."""

from .models.gemma4 import *  # noqa: F403
from .models.gemma4 import __all__  # noqa: F401
