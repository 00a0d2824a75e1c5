"""What the grader does to a student file's text: starter stubs, spliced region bodies, the protected text.

Regions are read with ``common.regions``; ``build_grading_copy`` (``grading.kit.submission``) and ``release``
write what these functions return.
"""
from __future__ import annotations

from pathlib import Path

from common.regions import PRISTINE_DIR, Region, parse_regions

PROTECTED_RECORD = "grading/protected.json"    # in a starter: the problems, regions and provided files released


def stub_body(region: Region) -> str:
    """The starter's body for ``region``: a NotImplementedError naming the problem and function."""
    return (f'{region.indent}raise NotImplementedError("Problem {region.id}: {region.function} is not '
            f'implemented yet (fill in the region marked BEGIN_STUDENT {region.id})")\n')


def replace_bodies(text: str, path: str, bodies: dict[int, str]) -> str:
    """Return ``text`` with the body of the k-th region (0-based) replaced by ``bodies[k]``."""
    regions = parse_regions(text, path)
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    cursor = 0
    for k, region in enumerate(regions):
        out.extend(lines[cursor:region.begin_line])          # up to and including BEGIN
        out.append(bodies[k] if k in bodies else region.body)
        out.append(lines[region.end_line - 1])               # END marker
        cursor = region.end_line
    out.extend(lines[cursor:])
    return "".join(out)


def protected_text(text: str, path: str) -> str:
    """``text`` with every region body removed (marker lines kept): what students may not change."""
    return replace_bodies(text, path, {k: "" for k in range(len(parse_regions(text, path)))})


def kit_text(root: Path, rel: str) -> str:
    """The kit's own text of student file ``rel``: the pristine copy in a starter, the file itself in the kit."""
    pristine = Path(root) / PRISTINE_DIR / rel
    return pristine.read_text() if pristine.is_file() else (Path(root) / rel).read_text()
