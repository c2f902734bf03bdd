"""Every real rank's results on every node: through the launcher's store.

Under a launcher the real ranks may run on several machines, each with its own
`prism-rr replay` and work directory. Each real rank puts what it writes to its work
directory under a key of the store too; each node's first worker, at its exit, waits
(bounded) for the other real ranks' results and writes them into its own work directory,
so that every node's `replay` reports on every real rank.
"""

from __future__ import annotations

import logging
import os
import time
from datetime import timedelta

from prism_rr.replayer._options import stats_path

__all__ = ["GATHER_S", "StatsExchange"]

log = logging.getLogger("prism_rr.replayer")
GATHER_S = 30.0  # how long a node waits for another node's results after its own ranks are done
_POLL_S = 0.05


class StatsExchange:
    """The results of the real ranks of one replay, on the launcher's store."""

    def __init__(self, store, ranks, work_dir):
        self._store = store
        self._ranks = tuple(ranks)
        self._work = work_dir

    @staticmethod
    def _key(rank: int) -> str:
        return f"stats/{rank}"

    def put(self, rank: int, text: str) -> None:
        self._store.set(self._key(rank), text)

    def gather(self, timeout_s: float = GATHER_S) -> list[int]:
        """Write the other real ranks' results into this node's work directory, as each
        arrives, for up to `timeout_s`; return the ranks that never did."""
        missing = [r for r in self._ranks if not stats_path(self._work, r).exists()]
        deadline = time.monotonic() + timeout_s
        self._store.set_timeout(timedelta(seconds=max(timeout_s, 1.0)))
        while missing:
            for r in [r for r in missing if self._store.check([self._key(r)])]:
                path = stats_path(self._work, r)
                text = self._store.get(self._key(r))
                if not path.exists():  # a rank of this node wrote its own meanwhile
                    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
                    tmp.write_bytes(text)
                    os.replace(tmp, path)
                missing.remove(r)
            if not missing or time.monotonic() > deadline:
                break
            time.sleep(_POLL_S)
        if missing:
            log.warning("prism-rr: no results from real rank(s) %s within %.0fs", missing, timeout_s)
        return missing
