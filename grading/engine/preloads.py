"""Library modules a rank imports that cost a second or more each: worth importing once, before ranks fork.

Two users, one list: the grader names them per case (``Case.preload``, through
``grading.problems.common``) for its fork servers, and the runners and
benchmarks pass them to ``project.launch``, whose CPU ranks fork from a
server that imported them (``project.rank_start``). A module here must be
importable without starting a thread under ``OMP_NUM_THREADS=1``
(``tests/kit/test_launcher.py`` checks every tuple): ``datasets`` is not, its
pyarrow starts jemalloc's background thread. Importing one a rank never
needs only costs the fork server that time, once.
"""
from __future__ import annotations

OPTIMIZER_IMPORTS = ("torch._dynamo",)         # a process's first torch.optim optimizer imports it (about 1 s)
GRADIENT_IMPORTS = ("torch.fx.experimental.symbolic_shapes",)   # a first backward(gradient) imports it (sympy, ~1 s)
GPT2_IMPORTS = (*OPTIMIZER_IMPORTS, "transformers.models.gpt2.modeling_gpt2")
DEEPSPEED_IMPORTS = (*OPTIMIZER_IMPORTS, "deepspeed",
                     "deepspeed.runtime.zero.muon.muon_optimizer",   # deepspeed.initialize: torch.compile's imports
                     "torch.utils.cpp_extension", "torch._inductor.codegen.cpp")
