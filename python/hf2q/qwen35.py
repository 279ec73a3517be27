"""``import hf2q.qwen35``: re-exports :mod:`hf2q.models.qwen35`."""

from .models.qwen35 import *  # noqa: F403
from .models.qwen35 import __all__  # noqa: F401
