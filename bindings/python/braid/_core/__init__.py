"""The core of braid's Python package, shared by its frontends: ``braid`` / ``braid.numpy``
(NumPy arrays) and ``braid.torch`` (torch tensors).

Modules, each over the ones above it (none imports a module below it):

- ``errors``: the error classes (the native module's) and the reduce ops;
- ``checks``: argument checks and the limits they enforce;
- ``handles``: the handle of an asynchronous collective, and the registry that keeps its
  buffers alive until the runtime is done with them;
- ``runtime``: joining and leaving the job, the topology, the names of unnamed calls, and
  ``enqueue_array`` / ``enqueue_pointer``, through which every request reaches the runtime;
- ``stats``: statistics and the timeline;
- ``compression``: the compression stage's state and registry;
- ``ndarray``: the collectives on NumPy arrays (the NumPy API);
- ``objects``: the collectives on picklable Python objects.

Between modules, public names only: no module of the package reads another's ``_private``
names, and only the core imports the native module ``braid._braid``. Each module's
``__all__`` lists what the frontends export to users as it is; its other public names are the
core's API for the frontends.
"""

from . import compression, errors, ndarray, objects, runtime, stats
from .compression import *  # noqa: F401,F403
from .errors import *  # noqa: F401,F403
from .ndarray import *  # noqa: F401,F403
from .objects import *  # noqa: F401,F403
from .runtime import *  # noqa: F401,F403
from .stats import *  # noqa: F401,F403

#: The NumPy API: what ``braid`` and ``braid.numpy`` export (the errors and ops among it are
#: errors.__all__, which braid.torch exports too).
__all__ = sorted(errors.__all__ + runtime.__all__ + stats.__all__ + compression.__all__
                 + ndarray.__all__ + objects.__all__)
