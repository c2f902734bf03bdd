"""`--slice roles` without `--mesh`: every rank records until the program's layout is known
(the DeviceMesh it builds, else, at the first step boundary, the groups it made); then a
rank that stands for no role stops recording and removes its spool. Every rank sees the
same groups, so all decide alike."""

from __future__ import annotations

import logging

from prism_rr.topology.roles import Mesh, mesh_from_groups, slice_ranks

__all__ = ["Slicing"]

log = logging.getLogger("prism_rr.recorder")


class Slicing:
    def __init__(self, rec):
        self.rec = rec
        self.pending = rec.options.slice_later
        self._groups: list[dict] = []  # every group created: what a layout is found from

    def group_seen(self, ranks, desc: str) -> None:
        """A group the program made (this rank in it or not), while the layout is sought."""
        self._groups.append({"ranks": tuple(int(r) for r in ranks), "desc": str(desc)})

    def settle(self, mesh=None) -> None:
        if not self.pending:
            return
        self.pending = False
        rec = self.rec
        groups, self._groups = self._groups, []
        try:
            by = "mesh"
            if isinstance(mesh, dict):
                mesh = Mesh.from_dict(mesh)
            if mesh is None or mesh.world_size != rec.world_size:
                mesh, by = mesh_from_groups(rec.world_size, groups), "groups"
            if mesh is None:
                if rec.rank == 0:
                    log.warning("prism-rr: --slice roles: the groups form no mesh; recording every rank "
                                "(give the layout with --mesh dp=..,tp=..)")
                return
            keep = slice_ranks(rec.world_size, mesh, rec.options.ranks or ())
        except Exception as exc:
            log.warning("prism-rr: --slice roles: no layout (%s: %s); recording every rank", type(exc).__name__, exc)
            return
        if rec.rank in keep:
            rec.add_info({"slice_mesh": mesh.to_dict(), "slice_by": by})
            return
        rec.close("stands for no role")
        rec.remove_spool()
