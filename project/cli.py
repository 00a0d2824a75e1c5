"""Command lines of the entry points: a parser whose errors are one line, value checkers, and the error exit.

Every bad value is refused while the arguments are parsed, before any data is read or any rank starts, with one
line that names the option and what it accepts and exit code 2: ``error: argument --lr: expected a finite number
> 0, got 'nan'``. A choice that can only be judged later raises ``ConfigError``, which ``run_cli`` turns into the
same. Nothing here imports torch: a parser reads the choices of the modules that do with ``read_constant``.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import math
import os
import sys
import traceback
from typing import Callable, NoReturn


class ConfigError(ValueError):
    """A bad command-line choice that parsing alone cannot judge (e.g. a dataset that does not exist, a world size
    larger than the data); entry points print it and exit with code 2 (no traceback)."""


class RankError(RuntimeError):
    """A rank process raised, died, gave no answer in time or waited for the others forever (``project.launch``).

    The message's first line names the rank at fault and what it did (``...: rank 1 failed: KeyError: 'w' (at
    data_parallel/comm.py:66 (in average_gradients))``, how it died, or the collective call on which the ranks
    parted); labelled lines follow (``likely cause:``, ``waiting:``, a ``symptom:`` line for every other rank that
    failed meanwhile), then the faulty rank's traceback. ``run_cli`` prints the traceback first and the labelled
    lines last, where a reader's eye lands."""


# The labels of a RankError's lines that ``run_cli`` prints after its ``error:`` line, in this order.
LABELS = ("likely cause:", "waiting:", "symptom:")


class RunFailed(RuntimeError):
    """A run that ended and found its own outcome wrong (a capstone invariant): ``run_cli`` prints ``FAILED:
    <message>`` (no traceback) and exits with code 1."""


class UniformError(ConfigError):
    """A ConfigError every rank of a torchrun run raises alike, because it depends only on the command line and
    the source files (an unwritten problem, ``project.readiness``): ``refusal_code`` says who reports it."""


def torchrun_rank() -> tuple[int, int] | None:
    """``(RANK, WORLD_SIZE)`` of this process when torchrun started it (both variables set), else None."""
    if "RANK" not in os.environ or "WORLD_SIZE" not in os.environ:
        return None
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def refusal_code(line: str) -> int:
    """Print ``line`` to stderr and return 2, for a refusal every rank reaches alike (the same bad command line, the
    same unwritten problem: ``UniformError``).

    Under torchrun only local rank 0 does that; the other ranks of its node return 0 at once, without printing.
    Were they to exit with 2 too, torchrun could stop local rank 0 (SIGTERM) before it has printed; this way the
    line is printed once per node and torchrun names one failure, local rank 0's.
    """
    started = torchrun_rank()
    if started is not None and int(os.environ.get("LOCAL_RANK", started[0])) != 0:
        return 0
    print(line, file=sys.stderr)
    return 2


def run_cli(main: Callable[[list[str] | None], object], argv: list[str] | None = None) -> int:
    """Run ``main(argv)``; a ConfigError becomes one line ``error: ...`` on stderr and exit code 2 (no traceback).

    A ``UniformError`` goes through ``refusal_code`` (under torchrun: printed once per node). A ``RankError``
    prints the faulty rank's traceback, then its one-line explanation and its labelled lines (``LABELS``), and
    gives exit code 1. A ``RunFailed`` prints ``FAILED: <message>``; exit code 1. Any other exception (raised in
    this process: a one-rank run, a pipeline) prints its traceback, then ``error:`` with the exception and the
    innermost frame in the student's code, and its likely cause where one is known (``common.error_words``);
    exit code 1. Ctrl-C (KeyboardInterrupt, after ``project.launch`` ended the spawned ranks) prints one line
    ``interrupted (Ctrl-C)``; exit code 130, as a shell reports a command that SIGINT ended.
    """
    try:
        main(argv)
    except RankError as exc:
        headline, *rest = str(exc).splitlines()
        labelled = [line for label in LABELS for line in rest if line.startswith(label)]
        report = [line for line in rest if not line.startswith(LABELS)]
        print(*report, f"error: {headline}", *labelled, sep="\n", file=sys.stderr)
        return 1
    except ConfigError as exc:
        line = f"error: {' '.join(str(exc).split())}"
        if isinstance(exc, UniformError):
            return refusal_code(line)
        print(line, file=sys.stderr)
        return 2
    except RunFailed as exc:
        print(f"FAILED: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return 130
    except Exception:   # noqa: BLE001 - the student's code failed in this process: explained, exit code 1
        from common.error_words import explained_traceback

        report = traceback.format_exc()
        print(report.rstrip(), *explained_traceback(report), sep="\n", file=sys.stderr)
        return 1
    return 0


class Parser(argparse.ArgumentParser):
    """An ``ArgumentParser`` that reports a bad command line in one line (``error: ...``) and exits with 2."""

    def error(self, message: str) -> NoReturn:
        """Print ``error: <prog>: <message>`` (one line, no usage block) to stderr and exit with code 2.

        Every torchrun rank has the same command line: ``refusal_code`` says which one reports it.
        """
        raise SystemExit(refusal_code(f"error: {self.prog}: {' '.join(message.split())}"))


def int_at_least(low: int) -> Callable[[str], int]:
    """An argparse ``type`` accepting integers ``>= low``; anything else is refused naming the range."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {text!r}")
        return value
    parse.__name__ = f"int>={low}"
    return parse


def float_above(low: float, inclusive: bool = False) -> Callable[[str], float]:
    """An argparse ``type`` accepting finite floats ``> low`` (``>= low`` when ``inclusive``); nan/inf refused."""
    relation = ">=" if inclusive else ">"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = math.nan
        if not math.isfinite(value) or value < low or (value == low and not inclusive):
            raise argparse.ArgumentTypeError(f"expected a finite number {relation} {low:g}, got {text!r}")
        return value
    parse.__name__ = f"float{relation}{low:g}"
    return parse


def lr_spike(text: str) -> tuple[int, float]:
    """``STEP:FACTOR`` (an int >= 1 and a finite float > 0), the fault injected by ``--lr_spike``."""
    step, sep, factor = text.partition(":")
    try:
        parsed = int(step), float(factor)
    except ValueError:
        parsed = (0, math.nan)
    if not sep or parsed[0] < 1 or not math.isfinite(parsed[1]) or parsed[1] <= 0:
        raise argparse.ArgumentTypeError(f"expected STEP:FACTOR with STEP >= 1 and FACTOR > 0, got {text!r}")
    return parsed


def read_constant(module: str, name: str) -> object:
    """The module-level constant ``name`` of ``module``, read from its source without importing the module.

    The value must be a literal; a dict gives its keys (its values may be
    any expression). For parsers: the modules that own the choices import
    torch, which an entry point imports only after its command line is
    checked (``project/__init__.py``). Raises LookupError when ``module``
    does not assign ``name``, ValueError when the value is not a literal.
    """
    path = importlib.util.find_spec(module).origin
    with open(path, encoding="utf-8") as source:
        tree = ast.parse(source.read(), path)
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign) and node.value is not None:
            targets = [node.target]
        else:
            continue
        if any(isinstance(target, ast.Name) and target.id == name for target in targets):
            if isinstance(node.value, ast.Dict):
                return tuple(ast.literal_eval(key) for key in node.value.keys)
            return ast.literal_eval(node.value)
    raise LookupError(f"{module} ({path}) does not assign {name}")
