"""The engine: file pipeline today; sessions, timeline, commit policy and the scheduler build on it."""

from .pipeline import Engine, FileRequest

__all__ = ["Engine", "FileRequest"]
