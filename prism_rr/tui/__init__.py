"""The terminal UI (`prism-rr tui`): browse, diagnose and compare recorded rank timelines.

Importing this package is cheap; textual is imported when the app runs.
"""

from __future__ import annotations

import os

# Deferred imports: tui.app (textual, numpy and the analysis) until `run` opens the app, so
# that importing this package stays as cheap as its docstring says.

__all__ = ["run"]


def run(bundle_path: str | os.PathLike, compare: str | os.PathLike | None = None) -> None:
    """Open the app on a bundle (and a replay to compare with) until the user quits."""
    from prism_rr.tui.app import PrismApp

    PrismApp(bundle_path, compare).run()
