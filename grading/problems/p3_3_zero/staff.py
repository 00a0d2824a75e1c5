"""Staff only (never released): the 3.3 answers, hidden inputs and hidden criteria."""
from __future__ import annotations

import random

from grading.problems.p3_3_zero import checks
from grading.problems.p3_3_zero.checks import ConfigPath, Expected, Inputs

ENGINE_EXTRAS = {"steps_per_print": 10 ** 9}       # keeps DeepSpeed's step log quiet in the training engine


def config_entries(world_size: int, micro_batch: int, grad_accum: int,
                   precision: str) -> dict[ConfigPath, bool | int | float]:
    """The answer of 3.3: the entries a ``build_config`` result must hold (path in the config -> value)."""
    return {
        ("train_batch_size",): world_size * micro_batch * grad_accum,
        ("train_micro_batch_size_per_gpu",): micro_batch,
        ("gradient_accumulation_steps",): grad_accum,
        ("zero_optimization", "stage"): 2,
        ("gradient_clipping",): 0.0,
        ("zero_allow_untested_optimizer",): True,
        ("fp16", "enabled"): precision == "fp16",
        ("bf16", "enabled"): precision == "bf16",
    }


def engine_config(world_size: int, micro_batch: int, grad_accum: int) -> dict:
    """The fp32 ``build_config`` result as a nested dict (the config ``train_microbatch`` runs in)."""
    config: dict = dict(ENGINE_EXTRAS)
    for (*sections, leaf), value in config_entries(world_size, micro_batch, grad_accum, "fp32").items():
        node = config
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return config


def expected(inputs: Inputs) -> Expected:
    """The entries of every ``build_config`` call of ``inputs``, and the training engine's config."""
    return Expected(entries={call: config_entries(*call) for call in inputs.configs},
                    engine_config=engine_config(*checks.ENGINE_SIZES))


def hidden_inputs(rng: random.Random) -> Inputs:
    """Three calls with secret sizes (world 2-16, micro-batch and accumulation 1-9) and precisions."""
    return Inputs(configs=tuple((rng.randint(2, 16), rng.randint(1, 9), rng.randint(1, 9),
                                 rng.choice(["fp32", "fp16", "bf16"])) for _ in range(3)))


HIDDEN_KIND = "other world sizes, micro-batch sizes, accumulation steps and precisions"
HIDDEN_POINTS = {checks.check_config: 1}
