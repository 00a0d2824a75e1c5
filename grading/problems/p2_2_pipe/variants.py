"""Buggy variants of 2.2 (staff only, not released): each loses exactly the criteria and breaks the clauses it names."""
from grading.kit.variants import Clause, Variant, edited

PIPE = "pipeline/pipe.py"

# Every variant is the reference region with targeted edits (``edited``: each old text must occur once).
GOOD_TASK = "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb.to(self.devices[j]))"

# A late-binding lambda computes wrong numbers, which necessarily shows in the outputs and in the gradients: it costs
# both value criteria of 2.2.
VARIANTS = [
    Variant("drops_partial_last_microbatch", PIPE, "forward", edited(PIPE, "forward", (
        "batches = list(torch.split(x, self.split_size))", """count = max(len(x) // self.split_size, 1)
        batches = [x[k * self.split_size:(k + 1) * self.split_size] for k in range(count)]"""),
        ("torch.cat(batches).to(self.devices[-1])", "torch.cat(batches)")),
        frozenset({"2.2.forward_uneven", "2.2.forward_hidden"}),
        breaks=(Clause("28", "Pipe.forward", "a smaller last micro-batch, split_size > batch (edge case, own "
                       "criterion)", "2.2.forward_uneven"),)),
    Variant("late_binding_lambda", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda: self.stages[j](batches[i].to(self.devices[j]))")),
        frozenset({"2.2.forward", "2.2.backward", "2.2.forward_hidden", "2.2.forward_uneven"}),
        hint="likely cause: a late-binding closure",
        breaks=(Clause("27", "Pipe.forward", "output equals the plain model, repeated calls, under no_grad",
                       "2.2.forward"),
                Clause("30", "Pipe.forward", "each task computes its own (i, j): `i` and `j` bound when the task is "
                       "created (a plain lambda reads them when it runs, a later task's)", "2.2.forward"))),
    # allowed forms of binding (full marks): the index bound, the micro-batch read when the task runs; a partial;
    # a closure returned by a helper
    Variant("micro_batch_read_when_run", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda i=i, j=j: self.stages[j](batches[i].to(self.devices[j]))")), frozenset()),
    Variant("task_from_partial", PIPE, "forward", edited(PIPE, "forward", (
        f"self.workers.submit(j, {GOOD_TASK})", """self.workers.submit(j, functools.partial(
                    lambda xb, j: self.stages[j](xb.to(self.devices[j])), batches[i], j))"""), (
        "batches = list(", "import functools\n        batches = list(")), frozenset()),
    Variant("task_from_helper_closure", PIPE, "forward", edited(PIPE, "forward", (
        f"self.workers.submit(j, {GOOD_TASK})", "self.workers.submit(j, task(self.stages[j], self.devices[j], "
        "batches[i]))"), ("batches = list(", """def task(stage, device, xb):
            return lambda: stage(xb.to(device))
        batches = list(""")), frozenset()),
    Variant("receive_right_after_submit", PIPE, "forward", edited(PIPE, "forward", (
        "            for i, j in wave:\n                batches[i] = self.workers.receive(j)",
        "                batches[i] = self.workers.receive(j)")), frozenset({"2.2.wave_dispatch"}),
        breaks=(Clause("29", "Pipe.forward", "submit the whole wave, then receive in the same order",
                       "2.2.wave_dispatch"),)),
    Variant("detach_between_stages", PIPE, "forward", edited(PIPE, "forward", (
        "self.stages[j](xb.to(", "self.stages[j]((xb if j == 0 else xb.detach()).to(")), frozenset({"2.2.backward"}),
        breaks=(Clause("34", "Pipe.forward", "never detach: gradients reach the input and every stage",
                       "2.2.backward"),)),
    Variant("result_on_input_device", PIPE, "forward", edited(PIPE, "forward", (
        "torch.cat(batches).to(self.devices[-1])", "torch.cat(batches).to(x.device)")),
        frozenset({"2.2.output_on_last_device"}),
        breaks=(Clause("33", "Pipe.forward", "result on the last stage's device", "2.2.output_on_last_device"),)),
    Variant("moves_input_in_caller", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda i=i, j=j, xb=batches[i].to(self.devices[j]): self.stages[j](xb)")),
        frozenset({"2.2.moves_in_worker"}),
        breaks=(Clause("33b", "Pipe.forward", "each task moves its input to its stage's device inside the worker "
                       "(recorded on CPU with a meta stage)", "2.2.moves_in_worker"),)),
    Variant("output_moved_instead_of_input", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb).to(self.devices[j])")),
        frozenset({"2.2.moves_in_worker"}), hint="the second stage received its input on cpu",
        breaks=(Clause("33d", "Pipe.forward", "the stage is called on its moved input (the meta stage notes the device "
                       "it receives: not the output moved, the stage moved or a discarded `.to` result)",
                       "2.2.moves_in_worker"),)),
    Variant("moved_copy_discarded", PIPE, "forward", edited(PIPE, "forward", (
        f"self.workers.submit(j, {GOOD_TASK})", """def task(i=i, j=j, xb=batches[i]):
                    xb.to(self.devices[j])          # Tensor.to is not in place: the stage gets xb as it was
                    return self.stages[j](xb)
                self.workers.submit(j, task)""")),
        frozenset({"2.2.moves_in_worker"}), hint="the second stage received its input on cpu",
        breaks=(Clause("33e", "Pipe.forward", "... the tensor `.to` returned, not the one it was called on "
                       "(`Tensor.to` is not in place)", "2.2.moves_in_worker"),)),
    Variant("input_moved_by_previous_stage", PIPE, "forward", edited(PIPE, "forward", (GOOD_TASK, (
        "lambda i=i, j=j, xb=batches[i]: self.stages[j](xb if j else xb.to(self.devices[0]))"
        ".to(self.devices[min(j + 1, len(self.devices) - 1)])"))),
        frozenset({"2.2.moves_in_worker"}), hint="expected only that stage's own worker 'pipeline-stage-1'",
        breaks=(Clause("33f", "Pipe.forward", "... by stage j's own worker, not by the task of stage j - 1 (its output "
                       "moved on to the next device)", "2.2.moves_in_worker"),)),
    Variant("stage_computed_in_the_caller", PIPE, "forward", edited(PIPE, "forward", (
        GOOD_TASK, "lambda out=self.stages[j](batches[i].to(self.devices[j])): out")),
        frozenset({"2.2.stage_exception", "2.2.moves_in_worker"}),
        breaks=(Clause("31", "Pipe.forward", "every stage call runs on its worker thread (recorded on CPU; binds the "
                       "GPU on GPUs)", "2.2.stage_exception"),
                Clause("32", "Pipe.forward", "a stage's error reaches the caller", "2.2.stage_exception"))),
    Variant("returns_microbatch_outputs", PIPE, "forward", edited(PIPE, "forward", (
        "return torch.cat(batches).to(self.devices[-1])", "return batches")),
            frozenset({"2.2.forward", "2.2.forward_hidden", "2.2.forward_uneven", "2.2.output_on_last_device",
                       "2.2.backward"}), hint="Pipe.forward returned list of",
            breaks=(Clause("33c", "Pipe.forward", "returns one tensor (`torch.cat`), not the list of the "
                           "micro-batches' outputs", "2.2.forward"),)),
]

NOT_GRADED = """Freedoms: `Pipe.forward`'s tasks may bind `i` and `j` by default arguments, `functools.partial` or a
helper's closure, and may read the micro-batch when they run (the full-marks variants `micro_batch_read_when_run`,
`task_from_partial`, `task_from_helper_closure`: the checks judge what a task computes, never how it is written).
Stated but not graded (behaviour that only exists on GPUs): the worker binding its CUDA device (provided runtime)."""
