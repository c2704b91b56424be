"""What the runtime remembers things with: the counters (:data:`STATS`), the one lock
its tables share (:data:`LOCK`) and bounded tables (:class:`LRU`).  What each table
holds is its own module's business; :func:`gemmlib.runtime.calls.clear_memory_caches`
forgets them all."""

from __future__ import annotations

import threading
from collections import OrderedDict

#: Counters: ``builds`` (kernel objects made), ``compiles`` (numba -> machine code),
#: ``disk_hits`` / ``disk_misses`` / ``disk_rejects`` (damaged entries), ``loads``
#: (modules loaded into a context), ``plans`` (launch plans made).
STATS = dict(builds=0, compiles=0, disk_hits=0, disk_misses=0, disk_rejects=0, loads=0,
             plans=0)
LOCK = threading.RLock()


class LRU(OrderedDict):
    """A table of at most ``size`` entries: past it, the oldest goes."""

    def __init__(self, size: int):
        super().__init__()
        self.size = size

    def put(self, key, value):
        with LOCK:
            self[key] = value
            if len(self) > self.size:
                self.popitem(last=False)
        return value
