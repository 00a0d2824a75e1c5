"""Fingerprints of code that renaming, literals, comments and layout do not change.

Python text becomes a stream of normalised tokens (``tokens_of``); token
k-grams are hashed (``gram_hashes``) and winnowed (Schleimer, Wilkerson and
Aiken 2003, ``winnow``): any shared run of ``K_GRAM + WINDOW - 1`` tokens is
always detected. ``content_hashes`` blanks out what the starter already has.
Used by the similarity report (``grading.commands.similarity``).
"""
from __future__ import annotations

import builtins
import hashlib
import keyword
import re
from dataclasses import dataclass

K_GRAM = 5          # tokens per fingerprinted k-gram
WINDOW = 4          # winnowing window: any shared run of K_GRAM + WINDOW - 1 tokens is always detected
PIECE_SEPARATOR = "<region>"   # the token between two regions of one problem (tokens_of never yields it)

_TOKEN_RE = re.compile(r"""
    (?P<comment>\#[^\n]*)
  | (?P<string>[rRbBuUfF]{0,2}(?:\"\"\"[\s\S]*?\"\"\"|'''[\s\S]*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<number>(?:\d|\.\d)(?:[eE][+-]|[\w.])*)
  | (?P<name>[^\W\d]\w*)
  | (?P<newline>\n)
  | (?P<continuation>\\\n)
  | (?P<space>[ \t\f\r]+)
  | (?P<op>\*\*=?|//=?|->|:=|<<=?|>>=?|[-+*/%&|^<>!=@]=|\S)
""", re.VERBOSE)
_KEPT_ALWAYS = frozenset(keyword.kwlist) | frozenset(keyword.softkwlist) | frozenset(dir(builtins))


@dataclass(slots=True)
class Token:
    """One normalised token and where it came from: piece index and 1-based line within that piece."""

    text: str
    piece: int
    line: int


def tokens_of(text: str, kept: frozenset[str], piece: int = 0) -> list[Token]:
    """Normalised tokens of Python ``text`` (any text: never raises on bad syntax).

    Comments, blank lines, indentation and line breaks inside brackets are
    dropped; a logical line ends with ``;``; names outside ``kept`` (plus
    keywords and builtins) become ``V``, except after a ``.``; numbers become
    ``N`` and strings ``S``.
    """
    out: list[Token] = []
    line, depth, previous = 1, 0, ""
    for match in _TOKEN_RE.finditer(text):
        kind, value = match.lastgroup, match.group()
        start_line = line
        line += value.count("\n")
        if kind in ("comment", "space", "continuation"):
            continue
        if kind == "newline":
            if depth == 0 and out and out[-1].text != ";":
                out.append(Token(";", piece, start_line))
            continue
        if kind == "string":
            if previous == "S":      # implicit concatenation "a" "b" is one literal
                continue
            norm = "S"
        elif kind == "number":
            norm = "N"
        elif kind == "name":
            norm = value if value in kept or value in _KEPT_ALWAYS or previous == "." else "V"
        else:
            norm = value
            depth += value in "([{"
            depth = max(0, depth - (value in ")]}"))
        out.append(Token(norm, piece, start_line))
        previous = norm
    return out


def gram_hashes(tokens: list[Token]) -> list[int]:
    """A stable 64-bit hash of every K_GRAM-token window, in order (one hash for a shorter stream)."""
    texts = [t.text for t in tokens]
    if not texts:
        return []
    grams = [texts[i:i + K_GRAM] for i in range(max(1, len(texts) - K_GRAM + 1))]
    return [int.from_bytes(hashlib.blake2b("\x1f".join(g).encode(), digest_size=8).digest(), "big")
            for g in grams]


def content_hashes(tokens: list[Token], starter: frozenset[int]) -> list[int | None]:
    """The k-gram hashes of ``tokens`` with the starter's part blanked out (None).

    A k-gram is blanked when the starter has it, or when every one of its
    tokens lies inside some k-gram the starter has: code glued together from
    pieces of the starter (a stub, then a copied provided helper) adds nothing.
    The separator between two regions of a problem counts as starter text.
    """
    hashes = gram_hashes(tokens)
    covered = [t.text == PIECE_SEPARATOR for t in tokens]
    for start, value in enumerate(hashes):
        if value in starter:
            covered[start:start + K_GRAM] = [True] * len(covered[start:start + K_GRAM])
    return [None if value in starter or all(covered[start:start + K_GRAM]) else value
            for start, value in enumerate(hashes)]


def winnow(hashes: list[int], window: int = WINDOW) -> frozenset[int]:
    """The winnowed fingerprints of ``hashes``: the minimum of every ``window`` consecutive hashes."""
    if len(hashes) <= window:
        return frozenset(hashes)
    return frozenset(min(hashes[i:i + window]) for i in range(len(hashes) - window + 1))
