"""A run's configuration: its command line, checked once in the parent (``project.options``), resolved and
frozen; every rank reads it and nothing changes it (a derived run is a ``dataclasses.replace`` of it).
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class RunConfig:
    """One run, immutable: the parsed options, read as attributes (``config.lr``), and what the parent resolved.

    The fields win over the option of the same name: ``world_size`` and ``backend`` as resolved (torchrun's
    size; ``auto`` made ``gloo`` or ``nccl``), ``out_dir`` the run folder every rank writes, ``resume`` the
    verified checkpoint (None: a fresh start) and ``checkpoint_meta`` its ``meta.json``, ``meta`` what this run's
    checkpoints record and a resume must match.
    An unknown name raises AttributeError.
    """

    options: tuple[tuple[str, Any], ...]   # (option, value) pairs of the command line, sorted
    world_size: int = 1
    backend: str = "gloo"
    out_dir: Path | None = None
    resume: Path | None = None
    checkpoint_meta: dict | None = None
    meta: dict | None = None

    @classmethod
    def of(cls, args: argparse.Namespace, **resolved: Any) -> RunConfig:
        """The config of the parsed command line ``args`` and the ``resolved`` fields."""
        return cls(tuple(sorted(vars(args).items())), **resolved)

    def __getattr__(self, name: str) -> Any:
        for key, value in self.__dict__.get("options", ()):
            if key == name:
                return value
        raise AttributeError(f"{type(self).__name__} has no option {name!r}")
