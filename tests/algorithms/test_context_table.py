"""docs/architecture.md's table of ClientContext's members, generated from the class (fedsim/algorithms/context_table.py)."""
from pathlib import Path

from fedsim.algorithms.context import ClientContext
from fedsim.algorithms.context_table import markdown_table, member_rows

DOCS = Path(__file__).resolve().parents[2] / "docs"


class Base:
    """A class of the kinds of member the table reads."""
    kind: str  # annotated on the class. Not this sentence

    def __init__(self, size: int):
        self.size = size  # set in __init__
        self._hidden = 0  # private: left out
        self.size = size + 1  # a second assignment: listed once

    @property
    def twice(self) -> int:
        """Twice the size (e.g. 2 for 1). Further sentences are left out."""
        return 2 * self.size

    def grow(self, by: int = 1, *, note: str | None = None) -> None:
        """Make it larger | wider <by> ``by<1>``."""

    def _private(self) -> None:
        """Left out."""


class Child(Base):
    def grow(self, by: int = 1, *, note: str | None = None) -> None:
        """Overridden: keeps the base's place."""

    @classmethod
    def make(cls) -> "Child":
        """A new one."""
        return cls(0)


def test_the_table_lists_every_public_member_in_source_order_with_its_first_sentence():
    assert member_rows(Child) == [
        ("`kind`", "annotated on the class."),
        ("`size`", "set in __init__"),
        ("`twice`", "Twice the size (e.g. 2 for 1)."),
        ("`grow(by=1, note=None)`", "Make it larger \\| wider &lt;by> ``by<1>``."),
        ("`make()`", "A new one."),
    ]


def test_every_public_member_of_the_context_is_in_the_table():
    written = {row[0].strip("`").partition("(")[0] for row in member_rows(ClientContext)}
    public = {name for name in dir(ClientContext) if not name.startswith("_")}
    assert public <= written  # methods and properties; attributes set in __init__ come on top
    assert {"client", "round", "generator", "uploads", "slots"} <= written


def test_the_architecture_docs_table_is_current():
    docs = (DOCS / "architecture.md").read_text()
    assert markdown_table() in docs, ("docs/architecture.md's ClientContext table is stale: run "
                                      "`python -m fedsim.algorithms.context_table docs/architecture.md`")
