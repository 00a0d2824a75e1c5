"""``grading.kit.quick_exit``: the kit's commands end as a normal exit would end them, minus the teardown."""
import subprocess
import sys
import textwrap

import pytest

from tests.kit.variants import KIT_ROOT

pytestmark = pytest.mark.kit

PROGRAM = """
import atexit, sys, threading, time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from grading.kit.quick_exit import run_and_exit
out = Path(sys.argv[1])

def late(name):
    time.sleep(0.3)
    (out / name).write_text("done")

def main():
    print("no newline at the end", end="")
    print("to stderr", file=sys.stderr)
    threading.Thread(target=late, args=("thread",)).start()            # non-daemon: joined first
    ThreadPoolExecutor(1).submit(late, "pool")                           # an executor's pending work finishes
    atexit.register(lambda: (out / "atexit").write_text(",".join(sorted(p.name for p in out.iterdir()))))
    return RESULT
run_and_exit(main)
"""


@pytest.mark.parametrize("result, code, stderr", [("3", 3, "to stderr\n"), ("None", 0, "to stderr\n"),
                                                  ("sys.exit('stopped: bad input')", 1, "stopped: bad input")])
def test_threads_atexit_and_output_finish_before_the_exit_code_is_returned(tmp_path, result, code, stderr):
    program = textwrap.dedent(PROGRAM).replace("RESULT", result)
    done = subprocess.run([sys.executable, "-c", program, str(tmp_path)], cwd=KIT_ROOT, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == code, done.stderr
    assert done.stdout == "no newline at the end" and stderr in done.stderr
    assert (tmp_path / "atexit").read_text() == "pool,thread"       # the handlers ran after both threads' work


def test_an_exception_propagates_as_in_a_normal_exit(tmp_path):
    done = subprocess.run([sys.executable, "-c", "from grading.kit.quick_exit import run_and_exit\n"
                           "run_and_exit(lambda: 1 / 0)"], cwd=KIT_ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1 and "ZeroDivisionError" in done.stderr and "Traceback" in done.stderr
