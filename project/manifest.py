"""The manifest of a checkpoint folder: size and sha256 of every file, written last, checked before a load.

Format (the one of Problem 4.3's ``save_sharded``)::

    manifest.json   {"format": 1, "step": 12, "files": {"state.pt": {"sha256": "...", "bytes": 53420}, ...}}

``write_manifest`` hashes what is on disk, so a folder whose manifest
matches holds exactly the bytes its save wrote; ``verify`` says, in words
fit for one line, which file differs and how (missing, size, sha256).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from common.files import atomic_write

MANIFEST = "manifest.json"
FORMAT = 1


def file_digest(path: Path) -> dict:
    """``{"sha256": hex digest, "bytes": size}`` of the file at ``path`` (read in 1 MiB blocks)."""
    digest, size = hashlib.sha256(), 0
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
            size += len(block)
    return {"sha256": digest.hexdigest(), "bytes": size}


def write_manifest(folder: Path, step: int) -> Path:
    """Hash every file under ``folder`` (subfolders too) into ``folder/manifest.json``, atomically; return it."""
    folder = Path(folder)
    files = {p.relative_to(folder).as_posix(): file_digest(p) for p in sorted(folder.rglob("*"))
             if p.is_file() and p.name != MANIFEST and not p.name.endswith(".tmp")}
    return atomic_write(folder / MANIFEST, json.dumps({"format": FORMAT, "step": step, "files": files},
                                                      indent=1) + "\n")


def verify(folder: Path) -> str | None:
    """None when every file ``folder/manifest.json`` lists is there with its size and sha256, else why not.

    The reason names the file, what the manifest expects and what was found,
    e.g. ``state.pt has 1,000 bytes, the manifest says 53,420``.
    """
    folder = Path(folder)
    if not folder.is_dir():
        return "the folder is missing"
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
        files = manifest["files"]
        if not isinstance(files, dict) or not files:
            raise ValueError("no files listed")
    except FileNotFoundError:
        return f"{MANIFEST} is missing (its save never finished)"
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{MANIFEST} is unreadable ({type(exc).__name__}: {exc})"
    for name, want in files.items():
        if not (isinstance(want, dict) and isinstance(want.get("bytes"), int) and isinstance(want.get("sha256"), str)):
            return f"{MANIFEST} is unreadable (its entry for {name!r} lacks bytes or sha256)"
        path = folder / name
        if not path.is_file():
            return f"{name} is missing (the manifest says {want['bytes']:,} bytes)"
        size = path.stat().st_size
        if size != want["bytes"]:
            return f"{name} has {size:,} bytes, the manifest says {want['bytes']:,}"
        found = file_digest(path)["sha256"]
        if found != want["sha256"]:
            return f"{name} has sha256 {found[:12]}..., the manifest says {want['sha256'][:12]}... (same size)"
    return None


def verify_sizes(folder: Path) -> bool:
    """True when every file of ``folder``'s manifest is there with its size (a cheap check, no hashing)."""
    try:
        files = json.loads((Path(folder) / MANIFEST).read_text())["files"]
        return all((Path(folder) / n).is_file() and (Path(folder) / n).stat().st_size == w["bytes"]
                   for n, w in files.items())
    except (OSError, ValueError, KeyError, TypeError):
        return False
