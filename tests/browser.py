"""Old home of the browser driver, kept for modules not yet moved to ``support``; delete when none imports it."""

from support.browser import Chromium

__all__ = ["Chromium"]
