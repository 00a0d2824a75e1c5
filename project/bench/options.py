"""What a benchmark run needs (``Options``): the command line's values, their defaults and their checks.

Light at import: ``scripts/run_benchmarks.py`` checks its options here
before it imports torch and the workers (``project/__init__.py``); ``suite``
runs what they describe.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Options:
    """Everything a benchmark run needs; ``quick`` picks the small defaults of the ``None`` fields."""

    mode: str = "student"
    quick: bool = False
    peers: bool = False
    preset: str = "tiny"
    batch_size: int | None = None
    max_len: int = 64
    steps: int | None = None
    warmup: int | None = None
    repeats: int | None = None
    n_chunks: tuple[int, ...] | None = None
    gpipe_chunks: int = 4
    dp_threshold: float = 1.4
    pp_threshold: float = 1.1
    threads: int | None = None
    workdir: str = "workdir"
    figures_dir: str = "submit_figures"
    timeout_s: float = 300.0
    seed: int = 0
    argv: list[str] = field(default_factory=list)

    def resolved(self) -> Options:
        """A copy with every ``None`` replaced by its default (smaller ones under ``quick``), ``validated``.

        The sizes are checked before the thread default is chosen, which counts GPUs (and so imports torch).
        """
        q = self.quick
        opts = Options(**{**asdict(self),
                          "batch_size": self.batch_size or (16 if q else 32), "steps": self.steps or (2 if q else 4),
                          "warmup": self.warmup if self.warmup is not None else (1 if q else 2),
                          "repeats": self.repeats or (3 if q else 5),
                          "n_chunks": tuple(sorted(set(self.n_chunks or ((2, 4) if q else (2, 4, 8)))
                                                   | ({self.gpipe_chunks} if self.peers else set())))}).validated()
        if opts.threads is None:
            from project.devices import cpu_threads_per_rank, gpu_count

            opts.threads = 0 if gpu_count() else cpu_threads_per_rank(2)
        return opts

    def validated(self) -> Options:
        """``self`` after checking the sizes; raises ValueError naming the bad option."""
        if self.mode not in ("student", "grader"):
            raise ValueError(f"mode must be student or grader, got {self.mode!r}")
        if self.batch_size < 2 or self.batch_size % 2:
            raise ValueError(f"--batch_size must be even and >= 2 (it is split over 2 ranks), got {self.batch_size}")
        for name in ("steps", "repeats"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name} must be at least 1, got {getattr(self, name)}")
        if self.warmup < 0:
            raise ValueError(f"--warmup must be >= 0, got {self.warmup}")
        from project.microbatch import check_n_chunk   # imports torch: after the checks above

        for m in (*self.n_chunks, self.gpipe_chunks):
            if not 1 <= m <= self.batch_size:
                raise ValueError(f"micro-batch counts must lie in [1, batch_size={self.batch_size}], got {m}")
            check_n_chunk(self.batch_size, m)   # the count a variant is named after is the count that runs
        if self.peers and self.batch_size % self.gpipe_chunks:
            raise ValueError(f"--gpipe_chunks {self.gpipe_chunks} must divide --batch_size {self.batch_size}")
        return self
