"""Problem 2: GPipe-style pipeline parallelism.

schedule  -- ``clock_cycles`` (student 2.1)
partition -- ``WithDevice``, ``split_module`` (student 2.1)
runtime   -- ``StageWorkers``: one worker thread per stage (provided)
pipe      -- ``Pipe``: micro-batches through the stages (student 2.2)
gpt2      -- a transformers GPT-2 as stages (student 2.3)
"""
from pipeline.partition import WithDevice, split_module
from pipeline.pipe import Pipe
from pipeline.runtime import StageWorkers
from pipeline.schedule import clock_cycles

__all__ = ["Pipe", "StageWorkers", "WithDevice", "clock_cycles", "split_module"]
