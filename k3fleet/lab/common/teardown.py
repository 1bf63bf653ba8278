"""What a lab left on the machine after its ``down``: the scan's result, named in one line."""

from __future__ import annotations

from dataclasses import dataclass, field

# How many of each kind a message names before it only counts the rest.
_NAMED = 5


def _some(items: list[str]) -> str:
    more = len(items) - _NAMED
    return ", ".join(items[:_NAMED]) + (f" and {more} more" if more > 0 else "")


@dataclass
class Leftovers:
    """Processes, namespaces and links of a lab still present; empty after a successful ``down``.

    A harness with more kinds of leftovers (mounts, files) adds fields and lists them in ``kinds``.
    """

    processes: dict[int, str] = field(default_factory=dict)
    netns: list[str] = field(default_factory=list)
    links: list[str] = field(default_factory=list)

    def kinds(self) -> list[tuple[str, list[str]]]:
        """Every kind besides processes, with the word that names it."""
        return [("netns", self.netns), ("links", self.links)]

    @property
    def empty(self) -> bool:
        return not self.processes and not any(items for _word, items in self.kinds())

    def describe(self) -> str:
        parts = []
        if self.processes:
            parts.append("processes " + _some([f"{pid} ({cmd})" for pid, cmd in sorted(self.processes.items())]))
        parts += [f"{word} {_some(items)}" for word, items in self.kinds() if items]
        return "; ".join(parts) or "nothing"
