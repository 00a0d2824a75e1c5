"""Student regions: parsing, malformed markers, splicing and the release."""
import json
import subprocess
import sys
import textwrap

import pytest

from grading.kit.course import DEFAULT_PROBLEMS
from common import ROOT
from common.regions import RegionError, parse_regions, student_files
from grading.kit.splice import protected_text
from grading.commands.release import release
from grading.kit.submission import build_grading_copy

pytestmark = pytest.mark.kit

GOOD = textwrap.dedent('''\
    def f(x):
        """Doc."""
        # BEGIN_STUDENT 9.1
        return x + 1
        # END_STUDENT 9.1
''')


def test_parse_finds_region_and_function():
    (region,) = parse_regions(GOOD, "m.py")
    assert (region.id, region.function, region.begin_line, region.end_line) == ("9.1", "f", 3, 5)
    assert region.body == "    return x + 1\n"


@pytest.mark.parametrize("text, message", [
    ("def f():\n    # BEGIN_STUDENT 1.1\n    pass\n", "m.py:2: BEGIN_STUDENT 1.1 is never closed"),
    ("def f():\n    # BEGIN_STUDENT 1.1\n    # BEGIN_STUDENT 1.2\n    pass\n", "m.py:3: BEGIN_STUDENT 1.2 nested"),
    ("def f():\n    # BEGIN_STUDENT 1.1\n    pass\n    # END_STUDENT 1.2\n",
     "m.py:4: END_STUDENT '1.2' does not match"),
    ("def f():\n    pass\n    # END_STUDENT 1.1\n", "m.py:3: END_STUDENT 1.1 without a matching"),
    ("# BEGIN_STUDENT 1.1\nx = 1\n# END_STUDENT 1.1\n", "m.py:1: region 1.1 is not inside a function"),
    ("def f():\n    # BEGIN_STUDENT\n    pass\n", "m.py:2: BEGIN_STUDENT without a problem id"),
    ("def f():\n    x = 1  # BEGIN_STUDENT 1.1\n", "m.py:2: student marker must stand alone"),
])
def test_malformed_markers_are_refused_with_file_and_line(text, message):
    with pytest.raises(RegionError) as info:
        parse_regions(text, "m.py")
    assert message in str(info.value)


def test_multiline_signature_counts_as_function():
    text = "def f(\n    x,\n) -> int:\n    # BEGIN_STUDENT 2.1\n    return x\n    # END_STUDENT 2.1\n"
    assert parse_regions(text, "m.py")[0].function == "f"


def test_release_writes_a_starter(tmp_path):
    out = tmp_path / "starter"
    record = release(ROOT, out)
    kit_files = student_files(ROOT, DEFAULT_PROBLEMS)
    assert sorted(record["student_files"]) == kit_files
    for rel in kit_files:
        released = (out / rel).read_text()
        for region in parse_regions(released, rel):
            assert region.body.strip().startswith(f'raise NotImplementedError("Problem {region.id}: '
                                                  f'{region.function} is not implemented')
        # protected text is unchanged and recorded
        assert protected_text(released, rel) == protected_text((ROOT / rel).read_text(), rel)
    assert not (out / "tests" / "kit").exists(), "kit self-tests (with buggy solutions) must not ship"
    assert not (out / "grading" / "hidden").exists(), "hidden checks must not ship"
    assert not (out / ".git").exists() and not (out / "workdir").exists()
    assert json.loads((out / "grading" / "protected.json").read_text()) == record
    # every starter module still imports
    modules = [rel[:-3].replace("/", ".") for rel in kit_files]
    subprocess.run([sys.executable, "-c", "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)",
                    *modules], cwd=out, check=True)


def test_release_refuses_malformed_markers_before_writing(tmp_path):
    kit = tmp_path / "kit"
    build_grading_copy(ROOT, ROOT, kit)
    target = kit / "data_parallel" / "comm.py"
    target.write_text(target.read_text().replace("# END_STUDENT 1.2", "# END_STUDENT 1.3", 1))
    out = tmp_path / "out"
    with pytest.raises(RegionError, match=r"data_parallel/comm.py:\d+: END_STUDENT '1.3' does not match"):
        release(kit, out)
    assert not out.exists()


def test_release_refuses_non_empty_target(tmp_path):
    (tmp_path / "x").write_text("keep me")
    with pytest.raises(FileExistsError):
        release(ROOT, tmp_path)
    assert (tmp_path / "x").read_text() == "keep me"
