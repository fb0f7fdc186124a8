"""Author-year labels in the chapters' reference lists, the same form as the citations in the text.

sphinxcontrib-bibtex writes citations in the text as "Vaswani et al., 2017" (bibtex_reference_style:
author_year) but labels a reference list with its pybtex style's label style ("[VSP+17]" for alpha).
This registers a pybtex style, "authoryear", whose labels read "Vaswani et al., 2017" too.
"""

from __future__ import annotations

from collections import defaultdict
from functools import lru_cache
from pathlib import Path

from pybtex.database import parse_file
from pybtex.plugin import register_plugin
from pybtex.style.formatting.unsrt import Style as UnsrtStyle
from pybtex.style.labels import BaseLabelStyle
from pybtex.style.sorting.author_year_title import SortingStyle


def _surname(person) -> str:
    return " ".join(str(part) for part in person.rich_prelast_names + person.rich_last_names).replace("{", "").replace("}", "")


def author_year(entry) -> str:
    people = entry.persons.get("author") or entry.persons.get("editor") or []
    year = entry.fields.get("year", "n.d.")
    if not people:
        return f"{entry.fields.get('title', entry.key)[:30]}, {year}"
    if len(people) == 1:
        names = _surname(people[0])
    elif len(people) == 2:
        names = f"{_surname(people[0])} and {_surname(people[1])}"
    else:
        names = f"{_surname(people[0])} et al."
    return f"{names}, {year}"


BIB = Path(__file__).resolve().parents[1] / "references.bib"


@lru_cache(maxsize=1)
def book_labels() -> dict[str, str]:
    """A label per key of the book's bibliography, unique across it: a 2023a and a 2023b where two collide."""
    entries = parse_file(str(BIB)).entries
    by_label = defaultdict(list)
    for key, entry in entries.items():
        by_label[author_year(entry)].append(key)
    labels = {}
    for label, keys in by_label.items():
        for n, key in enumerate(sorted(keys, key=lambda k: (entries[k].fields.get("title", ""), k))):
            labels[key] = label if len(keys) == 1 else f"{label}{chr(ord('a') + n)}"
    return labels


class AuthorYearLabels(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        labels = book_labels()
        for entry in sorted_entries:
            yield labels.get(entry.key, author_year(entry))


class AuthorYearStyle(UnsrtStyle):
    default_label_style = AuthorYearLabels
    default_sorting_style = SortingStyle


register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabels)
register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)


def setup(app):
    return {"parallel_read_safe": True, "parallel_write_safe": True}
