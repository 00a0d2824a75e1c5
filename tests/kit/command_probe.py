"""Run as ``python -m tests.kit.command_probe OUT [EXIT]`` by tests/kit/test_zygote.py, forked or cold: writes what a
command sees of its start (argv, its command line in ``ps``, folder, environment, session, random seed, torch
threads, temporary folder) to OUT, leaves a
non-daemon thread and an ``atexit`` hook that append to OUT when the interpreter ends, and exits with EXIT
(``sleep``: sleeps two minutes first)."""
import atexit
import json
import os
import random
import sys
import tempfile
import threading
import time

import torch


def main() -> int:
    out = sys.argv[1]
    if sys.argv[2:] == ["sleep"]:
        time.sleep(120)
    print("probe on stdout")
    print("probe on stderr", file=sys.stderr)
    with open("/proc/self/cmdline", "rb") as handle:
        cmdline = [part.decode() for part in handle.read().split(b"\0") if part]
    facts = {"argv": sys.argv, "cmdline": cmdline, "cwd": os.getcwd(), "marker": os.environ.get("PROBE_MARKER"),
             "sid_is_parent": os.getsid(0) == os.getppid(), "random": random.random(),
             "threads": torch.get_num_threads(), "tempdir": tempfile.gettempdir(),
             "stdin": sys.stdin.read()}
    with open(out, "w") as handle:
        json.dump(facts, handle)

    def late() -> None:
        time.sleep(0.3)
        with open(out + ".thread", "w") as handle:
            handle.write("joined")
    threading.Thread(target=late).start()
    def at_exit() -> None:
        with open(out + ".atexit", "w") as handle:
            handle.write("ran")
    atexit.register(at_exit)
    return int(sys.argv[2]) if len(sys.argv) > 2 else 0


if __name__ == "__main__":
    sys.exit(main())
