"""DFlash drafter support; see :mod:`hf2q.models.dflash` (this module re-exports it)."""

import typing as _typing

if _typing.TYPE_CHECKING:
    # hf2q.models.dflash builds its __all__ from its parts' lists, which type
    # checkers do not evaluate: they read the parts (each with a literal
    # __all__) here, so that `hf2q.dflash.load` and the rest are typed.
    from .models.dflash.config import *  # noqa: F403
    from .models.dflash.manifest import *  # noqa: F403
    from .models.dflash.model import *  # noqa: F403
    from .models.dflash.plan import *  # noqa: F403
    from .models.dflash.load import *  # noqa: F403
    from .models.dflash import FAMILY as FAMILY, DFlashFamily as DFlashFamily
else:
    from .models.dflash import *  # noqa: F403
from .models.dflash import __all__  # noqa: F401
