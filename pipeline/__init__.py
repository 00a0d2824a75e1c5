"""Problem 2: GPipe-style pipeline parallelism.

schedule  -- ``clock_cycles`` (student 2.1)
partition -- ``WithDevice``, ``split_module`` (student 2.1)
runtime   -- ``StageWorkers``: one worker thread per stage (provided)
pipe      -- ``Pipe``: micro-batches through the stages (student 2.2)
gpt2      -- a transformers GPT-2 as stages (student 2.3)

Nothing is imported here on purpose: a syntax error in one student module
must cost only its own problem, so import the modules themselves
(``from pipeline import pipe``).
"""
