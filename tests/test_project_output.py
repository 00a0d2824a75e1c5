"""project/output.py alone decides progress output: a tqdm bar on a terminal, no per-item lines in a log."""
from __future__ import annotations

import subprocess
import sys

from project import output
from common import ROOT



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


def test_off_a_terminal_progress_prints_nothing_and_hands_out_every_item(monkeypatch):
    stream = _Stream(tty=False)
    monkeypatch.setattr(sys, "stderr", stream)
    assert list(output.progress(range(25), False, desc="epoch 0", unit="batch")) == list(range(25))
    assert list(output.progress(iter("abc"), False, desc="gen")) == ["a", "b", "c"]   # length unknown
    assert stream.text == []


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
    for module in ("loop.py", "model.py"):   # the training loop's bar and the validation bar
        assert "progress" in (ROOT / "project" / module).read_text()


def test_a_piped_run_gets_its_log_lines_and_no_progress():
    code = ("from project.output import progress, log\n"
            "for _ in progress(range(4), False, desc='validation', unit='batch'): pass\n"
            "log('validation loss 1.0')\n")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert (done.stdout, done.stderr) == ("validation loss 1.0\n", "")
