"""The key bar at the foot of every screen: textual's Footer, rebuilt only when the keys
it would show change."""

from __future__ import annotations

from textual.screen import Screen
from textual.widgets import Footer


class KeyFooter(Footer):
    """textual's Footer rebuilds itself (a widget per key, each styled afresh) whenever a
    screen's bindings may have changed: on every change of focus, of screen, of a
    binding's check. Most of those show the same keys as before; under the TUI's tests
    the rebuilds were a third of the app's time. This one rebuilds when what it shows
    (keys, descriptions, enabled or not, tooltips) differs from what it shows now."""

    _shown: tuple | None = None

    def bindings_changed(self, screen: Screen) -> None:
        if self.is_attached and screen is self.screen and screen.app.app_focus:
            shown = _keys(screen)
            if self._bindings_ready and shown == self._shown:
                return
            self._shown = shown
        super().bindings_changed(screen)


def _keys(screen: Screen) -> tuple:
    return tuple((key, binding.key, binding.key_display, binding.description, binding.action, binding.show,
                  binding.group, enabled, tooltip)
                 for key, (_node, binding, enabled, tooltip) in screen.active_bindings.items())
