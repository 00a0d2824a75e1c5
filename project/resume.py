"""Which checkpoint a ``--resume`` names, verified before any rank starts; a rank's failed save as one line.

Both run in the parent: ``resolve`` checks a folder of ``project.checkpoint``'s layout against its manifest
(falling back from a damaged ``latest`` to the newest intact step), and ``save_errors_in_one_line`` turns the
``SaveError`` a rank reported into the parent's own one-line error.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Callable, Iterator

from project.checkpoint import LATEST, STEP_NAME, SaveError, checkpoints, latest_step
from project.cli import ConfigError
from project.manifest import verify


def _say(line: str) -> None:
    print(line, file=sys.stderr)


def resolve(path: str | Path, say: Callable[[str], None] = _say) -> Path:
    """The verified checkpoint folder ``--resume`` names: one ``step_<n>`` folder, or a root's best step.

    A ``step_<n>`` folder must pass ``verify``, else ConfigError (one line: the
    file, expected vs found). For a root, its ``latest`` and then every older
    step are tried, newest first (all steps when ``latest`` is missing,
    unreadable or dangling); each one skipped is reported with
    ``say(line)`` (default: stderr), e.g. ``--resume ckpt: skipped
    step_00000006 (state.pt has 1,000 bytes, the manifest says 53,420);
    resuming from step_00000004``. ConfigError when no step is intact.
    """
    path = Path(path)
    if STEP_NAME.match(path.name) and path.is_dir():
        problem = verify(path)
        if problem:
            raise ConfigError(f"--resume {path}: checkpoint {path.name} is damaged: {problem}; resume from the "
                              f"checkpoints folder {path.parent} to fall back to the newest intact step")
        return path
    steps = checkpoints(path)
    if not steps and not (path / LATEST).exists():
        raise ConfigError(f"--resume {str(path)!r}: no checkpoint there (expected a folder with a 'latest' file "
                          f"or a step_<n> folder, as written by --save_every)")
    skipped = []
    latest = latest_step(path)
    if isinstance(latest, str):
        skipped.append(latest)
    else:
        steps = [(s, f) for s, f in steps if s <= latest]
    for step, folder in reversed(steps):
        problem = verify(folder)
        if problem is None:
            for line in skipped:
                say(f"--resume {path}: skipped {line}; resuming from {folder.name}")
            return folder
        skipped.append(f"{folder.name} ({problem})")
    raise ConfigError(f"--resume {path}: no intact checkpoint: {'; '.join(skipped) or 'no step folders'}")


def save_error_of(exc: BaseException) -> SaveError | None:
    """The ``SaveError`` a failed rank reported (``project.launch.RankError``'s traceback), else None."""
    if isinstance(exc, SaveError):
        return exc
    marker = f"{SaveError.__module__}.SaveError: "
    lines = [line for line in str(exc).splitlines() if line.startswith(marker)]
    return SaveError(lines[-1][len(marker):]) if lines else None


@contextlib.contextmanager
def save_errors_in_one_line() -> Iterator[None]:
    """Around a launch of ranks: a rank's failed checkpoint write becomes one ``SaveError``, not a traceback."""
    try:
        yield
    except SaveError:
        raise
    except Exception as exc:  # noqa: BLE001 - only a reported SaveError is translated; the rest re-raised
        error = save_error_of(exc)
        if error is None:
            raise
        raise error from None
