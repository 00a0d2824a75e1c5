#!/usr/bin/env bash
# The CUDA/NCCL paths the CPU test suite cannot reach, in one run (<= 8 minutes on one H200: the part
# timeouts add up to 480 s, so one device call of at most 10 minutes always has room for it).
#
#   bash scripts/gpu_check.sh              # run every part, one summary line each (PASS/FAIL/SKIP + reason)
#   bash scripts/gpu_check.sh --dry-run    # print each part's command, run nothing
#
# Every part runs under its own `timeout`; a failure never stops the next part.
# Logs: $GPU_CHECK_DIR (default /tmp/gpu_check)/<part>.log. Exit code: 1 if a part failed, else 0.
set -u

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
OUT="${GPU_CHECK_DIR:-/tmp/gpu_check}"
PY="${PYTHON:-python}"
DRY=0
[ "${1:-}" = "--dry-run" ] && DRY=1
W="$OUT/work"
TINY="--workdir $W --n_train 256 --n_valid 32 --n_epochs 1 --quiet"

# Problem 5.1 on a 1-rank NCCL group: non-contiguous inputs and gradients through f and g, CUDA shards.
TP_NCCL="import torch, torch.distributed as dist; torch.cuda.set_device(0); \
dist.init_process_group('nccl', init_method='file://$OUT/tp_store', rank=0, world_size=1); \
from tensor_parallel.layers import copy_to_parallel_region as f, reduce_from_parallel_region as g; \
from tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear; \
x = torch.randn(4, 6, device='cuda').t().requires_grad_(); g(x).backward(torch.randn(4, 6, device='cuda').t()); \
x = torch.randn(4, 6, device='cuda').t().requires_grad_(); f(x).backward(torch.randn(4, 6, device='cuda').t()); \
column = ColumnParallelLinear.from_linear(torch.nn.Linear(6, 12).cuda(), chunks=3); \
row = RowParallelLinear.from_linear(torch.nn.Linear(12, 6).cuda()); \
assert all(p.is_cuda for p in [*column.parameters(), *row.parameters()]), 'shards left the layer device'; \
row(column(torch.randn(2, 6, device='cuda'))).sum().backward(); dist.destroy_process_group(); print('ok')"

# name | seconds | needs (gpu: 1 GPU) | command
PARTS=(
  "pipeline_cuda0|35|gpu|$PY project/run_pipeline.py --model_parallel_mode pipeline_parallel --devices cuda:0,cuda:0 --n_chunk 4 $TINY --out_dir $OUT/pipeline"
  "model_parallel_cuda0_bf16_ckpt|35|gpu|$PY project/run_pipeline.py --model_parallel_mode model_parallel --devices cuda:0,cuda:0 --precision bf16 --grad_ckpt $TINY --out_dir $OUT/mp"
  "pipeline_fp16_gradscaler|35|gpu|$PY project/run_pipeline.py --model_parallel_mode pipeline_parallel --precision fp16 $TINY --out_dir $OUT/pp_fp16"
  "data_parallel_nccl_resume|50|gpu|$PY project/run_data_parallel.py --world_size 1 --backend nccl --save_every 2 --max_steps 3 $TINY --out_dir $OUT/dp && $PY project/run_data_parallel.py --world_size 1 --backend nccl --resume $OUT/dp/checkpoints $TINY --out_dir $OUT/dp"
  "zero2_nccl_one_rank|45|gpu|$PY project/run_finetune.py --world_size 1 --backend nccl --micro_batch 8 $TINY --out_dir $OUT/zero2"
  "zero2_fp16_config|45|gpu|$PY project/run_finetune.py --world_size 1 --backend nccl --precision fp16 --micro_batch 8 $TINY --out_dir $OUT/zero2_fp16"
  "zero3_offload_nccl|45|gpu|$PY project/run_finetune.py --world_size 1 --backend nccl --zero_stage 3 --offload cpu --micro_batch 8 $TINY --out_dir $OUT/zero3"
  "benchmark_gpu_quick|70|gpu|$PY scripts/run_benchmarks.py --quick --workdir $W --figures_dir $OUT/figures"
  # grading on a GPU: 1.2's ranks on CUDA when there are enough GPUs; 3.2's adapters cast to a CUDA model's device
  "grade_problems_1_2_and_3_2|60|gpu|$PY -m grading grade --problem 1.2 && $PY -m grading grade --problem 3.2"
  # Problem 5.1 on NCCL (tensor_parallel/layers.py's contract): the region functions all-reduce contiguous
  # copies (NCCL refuses non-contiguous tensors, gloo does not), and from_linear keeps a CUDA layer's shards on its
  # device.
  "tensor_parallel_nccl_contiguous|30|gpu|rm -f $OUT/tp_store && $PY -c \"$TP_NCCL\""
  # Problem 4 on one CUDA rank (data_parallel/zero1.py's and checkpoint.py's contracts): ZeRO-1 master shard on
  # the parameters' device, model.pt with CPU tensors of a CUDA model, load_sharded back onto CUDA.
  "problem4_cuda|30|gpu|$PY -m grading.problems.p4_3_checkpoint.cuda_check"
)

have_gpu() {
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 1)" \
    2>/dev/null
}

cd "$ROOT" || exit 1
[ $DRY -eq 0 ] && mkdir -p "$OUT"          # a dry run writes nothing
GPU=0
[ $DRY -eq 0 ] && have_gpu && GPU=1
failed=0
for part in "${PARTS[@]}"; do
  IFS='|' read -r name seconds needs command <<<"$part"
  if [ $DRY -eq 1 ]; then
    echo "$name (timeout ${seconds}s): $command"
    continue
  fi
  if [ "$needs" = "gpu" ] && [ $GPU -eq 0 ]; then
    echo "SKIP $name: no CUDA device visible to torch"
    continue
  fi
  start=$(date +%s)
  timeout --kill-after=10 "$seconds" bash -c "$command" >"$OUT/$name.log" 2>&1
  code=$?
  took=$(( $(date +%s) - start ))
  if [ $code -eq 0 ]; then
    echo "PASS $name (${took}s)"
  elif [ $code -eq 124 ] || [ $code -eq 137 ]; then
    echo "FAIL $name: timed out after ${seconds}s (log: $OUT/$name.log)"
    failed=1
  else
    reason=$(grep -v '^\s*$' "$OUT/$name.log" | tail -n 1 | cut -c1-200)
    echo "FAIL $name: exit $code: $reason (log: $OUT/$name.log)"
    failed=1
  fi
done
exit $failed
