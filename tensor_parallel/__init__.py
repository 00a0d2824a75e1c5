"""Problem 5: Megatron-style tensor parallelism (one layer split across ranks).

layers -- the two parallel-region autograd functions (``copy_to_parallel_region``:
          identity forward / all-reduce backward; ``reduce_from_parallel_region``:
          all-reduce forward / identity backward), ``ColumnParallelLinear`` and
          ``RowParallelLinear`` built from a full ``nn.Linear`` (student 5.1)
gpt2   -- ``parallelize_block``: a ``transformers`` GPT-2 block split across the
          ranks of a group, q/k/v by heads (student 5.2)

A column -> row pair is Megatron's MLP::

    x (full, every rank) -> f -> [x W1_r^T + b1_r] -> act -> [h_r W2_r^T] -> g -> + b2 -> y (full)
                            |    column parallel              row parallel    |
               identity fwd / all-reduce bwd                      all-reduce fwd / identity bwd

Nothing is imported here on purpose: a syntax error in one student module
must cost only its own problem, so import the modules themselves
(``from tensor_parallel import layers``).
"""
