"""Replay: real ranks run the original program against virtual peers driven by a bundle."""

from prism_rr.replayer.launch import ReplayResult, replay

__all__ = ["ReplayResult", "replay"]
