"""braid.numpy: the NumPy frontend (the same functions as the top-level ``braid`` package).

``import braid.numpy as bnp`` reads well next to a framework binding (``braid.torch``).
"""

from . import *  # noqa: F401,F403
from . import __all__  # noqa: F401
