"""Old home of the process helpers, kept for modules not yet moved to ``support``; delete when none imports it."""

from support.processes import free_port, gone, running

__all__ = ["free_port", "gone", "running"]
