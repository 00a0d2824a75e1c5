"""The Jinja templates of the staff pages (class report, similarity report, mutants report) and ``render``.

A page module passes plain data (strings, numbers, lists, dicts); the templates print it with autoescape on, so
every piece of student-controlled text (names, code, messages) shows as text, never as markup. ``base.html``
holds what the pages share (head, style); each page extends it.
"""
from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any
from urllib.parse import quote

TEMPLATES = Path(__file__).parent


@cache
def _environment() -> Any:
    import jinja2   # here, not at the top: `python -m grading` imports the page modules for every command

    environment = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), autoescape=True,
                                     undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True,
                                     keep_trailing_newline=True)
    environment.filters["quote"] = quote      # a relative link's path, percent-encoded as urllib does
    return environment


def render(name: str, **data: Any) -> str:
    """The HTML of template ``name`` (a file in this folder) filled with ``data``, every value escaped."""
    return _environment().get_template(name).render(**data)
