"""numpy, imported on first use: ``import hf2q; hf2q.Device("host")`` does
not pay for it (about 70-100 ms of CPU, most of a 100 ms budget; README,
"Benchmarks"). Modules on that path write

    if TYPE_CHECKING:
        import numpy as np
    else:
        from ._lazy import numpy as np

and use ``np`` as usual: the first attribute read imports numpy and copies
its namespace into the stand-in, so later reads are plain attribute lookups
(no ``__getattr__`` call). Type checkers see numpy itself.
"""

from __future__ import annotations

import importlib
import types
from typing import Any

__all__ = ["numpy"]


class _LazyModule(types.ModuleType):
    """A module that imports the real one when an attribute is first read."""

    def __getattr__(self, name: str) -> Any:
        real = importlib.import_module(self.__name__)
        if not self.__dict__.get("_lazy_copied"):
            # Later reads find the names in the instance dict (no __getattr__).
            # Once: a name numpy lacks (``hasattr(np, "float8_e4m3fn")``) comes
            # back here on every read, and copying the namespace each time cost
            # 65 us a read (0.4 s over a 6,000-tensor FP8 load).
            self.__dict__.update({k: v for k, v in vars(real).items() if k not in ("__name__", "__spec__")})
            self.__dict__["_lazy_copied"] = True
        try:
            return vars(real)[name]
        except KeyError:
            pass
        # numpy's own module __getattr__ (lazily imported submodules such as
        # ``np.dtypes``, deprecated aliases): kept once found, or every read of
        # it would come back here and copy the namespace again (a scale read per
        # FP8 expert did, 60 us each).
        value = getattr(real, name)
        self.__dict__[name] = value
        return value

    def __repr__(self) -> str:
        return f"<lazy module {self.__name__!r}>"


numpy: Any = _LazyModule("numpy")
