"""Every environment variable the kit reads, in one place: what a person sets (``Settings``) and what the kit hands
its own child processes (the hand-over names below).

    settings().memory_mb          # GRADING_MEMORY_MB, parsed and checked; a bad value: ValueError naming it

``settings()`` parses and checks the variables once per set of values: the cache is keyed by what they hold now,
so a command or a test that changes one on purpose (``--problems``, ``monkeypatch.setenv``) is seen at the next
call without anyone clearing it, and a value cannot change under a caller in between. ``fresh()`` empties the
cache. The course secret's value is never held here: ``grading.kit.secret`` reads it. The staff's page of
them all is generated from this module (``python -m grading docs``).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass, field, fields
from typing import Any, Mapping

def _setting(env: str, default: Any, doc: str, *, minimum: int | None = None, choices: tuple = (),
             empty_is_value: bool = False) -> Any:
    """A ``Settings`` field read from the variable ``env``: ``doc`` says what it does (the staff page of settings
    prints it); an int at least ``minimum``, or one of ``choices``. An empty value means the default, unless
    ``empty_is_value``."""
    return field(default=default, metadata={"env": env, "doc": doc, "minimum": minimum, "choices": choices,
                                            "empty_is_value": empty_is_value})


@dataclass(frozen=True)
class Settings:
    """What a person may set, each from one environment variable (``field.metadata["env"]``); the defaults run."""

    sandbox: bool = _setting(
        "GRADING_SANDBOX", True,
        "Limit and isolate every process that runs student code: the limits below, private namespaces, a view of "
        "the machine without the grader's files ([sandbox.md](sandbox.md)). 0 turns all of it off, to debug the "
        "grader only: each grade then says its ranks ran without isolation.")
    memory_mb: int = _setting(
        "GRADING_MEMORY_MB", 8192,
        "Each rank's memory limit (`RLIMIT_DATA`) in MB; 0: none. DeepSpeed ZeRO-2 reserves about 2 GB per rank: "
        "keep 4096 or more.", minimum=0)
    open_files: int = _setting(
        "GRADING_OPEN_FILES", 4096, "Each rank's limit on open files (`RLIMIT_NOFILE`); 0: none.", minimum=0)
    file_mb: int = _setting(
        "GRADING_FILE_MB", 256,
        "The largest file a rank may write, its own logs included (`RLIMIT_FSIZE`), in MB; 0: none.", minimum=0)
    network: bool = _setting(
        "GRADING_NETWORK", False,
        "1: ranks keep the host's network; 0: each case gets a network namespace with only loopback.")
    rank_user: str = _setting(
        "GRADING_RANK_USER", "student",
        "The user a root grader runs ranks as, where that user exists and can use the interpreter and its "
        "libraries (else root without capabilities); empty or `-`: stay root, without capabilities.",
        empty_is_value=True)
    hide: tuple[str, ...] = _setting(
        "GRADING_HIDE", (),
        "More paths (`:`-separated) that ranks see as empty folders, even inside a system folder such as `/etc`.")
    threads: int = _setting("GRADING_THREADS", 1, "torch's intra-op threads in each rank (`torch.set_num_threads`).",
                            minimum=1)
    fork_server: bool = _setting(
        "GRADING_FORKSERVER", True,
        "Fork ranks (and `batch`'s grades) from warm servers that imported torch once; 0: every rank a fresh "
        "interpreter (the same verdicts, slower), e.g. to compare.")
    fork_servers: int = _setting(
        "GRADING_FORKSERVERS", 2,
        "How many fork servers a grading run keeps: 2 keeps the second one, which the cases whose ranks must differ "
        "in hash seed need, between them; 1 starts it for such a case and stops it after (the least memory; "
        "Gradescope's `run_autograder` sets 1).", choices=(1, 2))
    problems: str = _setting(
        "GRADING_PROBLEMS", "",
        "The course's problems, e.g. `1,2,3,4` (`--problems` sets it for one command); empty: those "
        "`grading/course.json` records, else 1,2,3. The only way to name an example problem (90 and up).")
    python: str = _setting(
        "GRADING_PYTHON", "",
        "The interpreter of the scripts the kit writes: a Slurm array's task and submit scripts (and the paths "
        "`slurm submit` checks; empty: the one that made the array), Gradescope's `run_autograder` (the bundle's "
        "venv) and `setup.sh` (`python3`, which makes the venv).")
    rank_start: str = _setting(
        "KIT_RANK_START", "auto",
        "How `project/`'s entry points start ranks: `auto` forks them from a fork server (`common/forkserver.py`) on "
        "Linux where no GPU is visible, else starts fresh interpreters; `spawn` or `forkserver` forces one.",
        choices=("auto", "spawn", "forkserver"))

    def __post_init__(self) -> None:
        for each in fields(self):
            _check(each, getattr(self, each.name), getattr(self, each.name))

    @staticmethod
    def env_name(name: str) -> str:
        """The environment variable of field ``name``."""
        return next(each.metadata["env"] for each in fields(Settings) if each.name == name)


# The course secret, by name only (a Settings object may be printed): ``grading.kit.secret.course_secret`` reads it.
SECRET_ENV = "GRADING_COURSE_SECRET"

# The settings code names directly (to pass on, set or mention them).
PROBLEMS_ENV = Settings.env_name("problems")
THREADS_ENV = Settings.env_name("threads")
FORKSERVER_ENV = Settings.env_name("fork_server")
SERVERS_ENV = Settings.env_name("fork_servers")
USER_ENV = Settings.env_name("rank_user")
HIDE_ENV = Settings.env_name("hide")
RANK_START_ENV = Settings.env_name("rank_start")

# Set by the kit for its own child processes; never set by hand.
POOL_ENV = "GRADING_FORKSERVER_POOL"
SERVER_KIT_ENV = "GRADING_FORKSERVER_KIT"
RUN_MARKER = "GRADING_RUN_ID"
STARTED_ENV = "GRADING_PROCESS_STARTED"
HAND_OVER = (POOL_ENV, SERVER_KIT_ENV, RUN_MARKER, STARTED_ENV)



# ------------------------------------------------------------------------------------------ reading
def _expected(each) -> str:
    """What field ``each`` accepts, in words."""
    choices = [str(c) for c in each.metadata["choices"]]
    if choices:
        return f"{', '.join(choices[:-1])} or {choices[-1]}"
    if each.type == "bool":
        return "0 or 1"
    if each.type == "int":
        return f"a whole number, at least {each.metadata['minimum']}"
    return "text"


def _check(each, value: Any, shown: Any) -> None:
    """Raise the one-line ValueError for field ``each`` when ``value`` is not allowed (``shown``: as given)."""
    minimum, choices = each.metadata["minimum"], each.metadata["choices"]
    if (choices and value not in choices) or (minimum is not None and value < minimum):
        raise ValueError(f"{each.metadata['env']} must be {_expected(each)}, not {shown!r}")


def _parse(each, raw: str | None) -> Any:
    """The value of field ``each`` from the variable's text ``raw`` (None: unset), checked."""
    if raw is None or (raw.strip() == "" and not each.metadata["empty_is_value"]):
        return each.default
    if each.type == "bool":
        if raw.strip() not in ("0", "1"):
            raise ValueError(f"{each.metadata['env']} must be {_expected(each)}, not {raw!r}")
        return raw.strip() == "1"
    if each.type == "int":
        try:
            value = int(raw.strip())
        except ValueError:
            raise ValueError(f"{each.metadata['env']} must be {_expected(each)}, not {raw!r}") from None
        _check(each, value, raw)
        return value
    if each.type == "tuple[str, ...]":
        return tuple(part for part in raw.split(os.pathsep) if part)
    _check(each, raw, raw)
    return raw


@functools.cache
def _parsed(values: tuple[str | None, ...]) -> Settings:
    return Settings(**{each.name: _parse(each, raw) for each, raw in zip(fields(Settings), values)})


def settings_from(env: Mapping[str, str]) -> Settings:
    """The settings ``env`` holds (unset ones at their defaults); ValueError naming a variable whose value is bad."""
    return _parsed(tuple(env.get(each.metadata["env"]) for each in fields(Settings)))


def settings() -> Settings:
    """This process's settings, from its environment now (parsed once per set of values: module docstring)."""
    return settings_from(os.environ)


def fresh() -> Settings:
    """Empty the cache and read the environment again."""
    _parsed.cache_clear()
    return settings()


__all__ = ["FORKSERVER_ENV", "HAND_OVER", "HIDE_ENV", "POOL_ENV", "PROBLEMS_ENV", "RANK_START_ENV", "RUN_MARKER",
           "SECRET_ENV", "SERVERS_ENV", "SERVER_KIT_ENV", "STARTED_ENV", "THREADS_ENV",
           "USER_ENV", "Settings", "fresh", "settings", "settings_from"]

