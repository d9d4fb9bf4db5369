"""Old home of the page attacker, kept for modules not yet moved to ``support``; delete when none imports it."""

from support.page_attack import attack, attack_result, summary, viewer

__all__ = ["attack", "attack_result", "summary", "viewer"]
