"""project/output.py alone decides progress output: a tqdm bar on a terminal, plain lines in a log (issue 21.4)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from project import output

ROOT = Path(__file__).resolve().parent.parent


class _Stream:
    """A stand-in for stderr whose ``isatty`` is chosen."""

    def __init__(self, tty: bool):
        self.tty, self.text = tty, []

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        self.text.append(text)
        return len(text)

    def flush(self) -> None:
        pass


def test_off_a_terminal_progress_is_plain_lines_every_tenth_and_at_the_end(monkeypatch):
    stream = _Stream(tty=False)
    monkeypatch.setattr(sys, "stderr", stream)
    assert list(output.progress(range(25), False, desc="epoch 0", unit="batch")) == list(range(25))
    lines = "".join(stream.text).splitlines()
    assert "\r" not in "".join(stream.text)
    assert [line.split(" (")[0] for line in lines] == [f"epoch 0: {n}/25 batch" for n in (*range(2, 25, 2), 25)]
    stream.text.clear()
    bar = iter(output.progress(range(3), False, desc="manual", unit="batch", every=5))
    for _ in range(3):   # the training loop advances by hand and never asks past the last batch
        next(bar, None)
    assert [line.split(" (")[0] for line in "".join(stream.text).splitlines()] == ["manual: 3/3 batch"]
    stream.text.clear()
    assert list(output.progress(iter("abc"), False, desc="gen")) == ["a", "b", "c"]   # length unknown
    assert [line.split(" (")[0] for line in "".join(stream.text).splitlines()] == ["gen: 3/3 it"]


def test_quiet_shows_nothing_and_a_terminal_gets_tqdm(monkeypatch):
    stream = _Stream(tty=False)
    monkeypatch.setattr(sys, "stderr", stream)
    items = range(4)
    assert output.progress(items, True, desc="x") is items
    output.log("hidden", quiet=True)
    assert not stream.text
    monkeypatch.setattr(sys, "stderr", _Stream(tty=True))
    from tqdm.auto import tqdm

    assert isinstance(output.progress(items, False, desc="x"), tqdm)


def test_no_other_module_of_the_project_draws_progress_itself():
    """Every tqdm use in project/ and scripts/ goes through project.output (the one place that decides)."""
    users = [str(p.relative_to(ROOT)) for folder in ("project", "scripts") for p in (ROOT / folder).rglob("*.py")
             if "tqdm" in p.read_text() and p.name != "output.py"]
    assert users == []
    for module in ("loop.py", "loss.py"):   # the training loop's bar and the validation bar
        assert "progress" in (ROOT / "project" / module).read_text()


def test_a_piped_run_gets_plain_lines_and_no_carriage_returns():
    code = ("from project.output import progress, log\n"
            "for _ in progress(range(4), False, desc='validation', unit='batch'): pass\n"
            "log('validation loss 1.0')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "\r" not in done.stderr + done.stdout
    assert done.stderr.splitlines()[-1].startswith("validation: 4/4 batch (")
    assert done.stdout == "validation loss 1.0\n"
