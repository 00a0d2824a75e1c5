"""``project.config.RunConfig``: one frozen config per run, read as attributes, handed to the ranks as it is;
and no entry point rewrites its parsed options after parsing."""
from __future__ import annotations

import ast
import dataclasses
import pickle
from pathlib import Path

import pytest

from project import run_data_parallel
from project.config import RunConfig
from common import ROOT

pytestmark = pytest.mark.project



def _config(**resolved) -> RunConfig:
    return RunConfig.of(run_data_parallel.build_parser().parse_args(["--lr", "0.01", "--world_size", "3"]),
                        **resolved)


def test_options_read_as_attributes_and_resolved_fields_win():
    config = _config(world_size=2, backend="gloo", out_dir=Path("run"))
    assert config.lr == 0.01 and config.batch_size == 32 and config.resume is None
    assert config.world_size == 2 and config.out_dir == Path("run")   # not the option's 3 and None
    with pytest.raises(AttributeError, match="no option 'nope'"):
        config.nope  # noqa: B018


def test_nothing_changes_a_config_and_a_derived_run_is_a_replace():
    config = _config(world_size=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.lr = 1.0
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.world_size = 1
    one = dataclasses.replace(config, world_size=1, out_dir=Path("ws1"))
    assert (one.world_size, one.out_dir, one.lr) == (1, Path("ws1"), 0.01) and config.world_size == 2


def test_a_config_reaches_a_rank_as_it_is():
    config = _config(world_size=2, resume=Path("ckpt/step_00000004"), meta={"entry": "data_parallel"})
    copy = pickle.loads(pickle.dumps(config))
    assert copy == config and copy.lr == 0.01 and copy.resume == Path("ckpt/step_00000004")


def test_no_entry_point_assigns_to_its_parsed_options():
    """``args.x = ...`` (or ``setattr(args, ...)``) nowhere in the entry points or the option checks."""
    found = []
    for path in [*sorted((ROOT / "project").glob("run_*.py")), ROOT / "project" / "options.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else \
                [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
            found += [f"{path.name}:{node.lineno}" for t in targets
                      if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "args"]
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "setattr":
                found.append(f"{path.name}:{node.lineno}")
    assert not found, found
