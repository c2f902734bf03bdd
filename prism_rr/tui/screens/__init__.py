"""The TUI's screens: overview, timeline, collectives, compare, help."""
