#!/usr/bin/env bash
# The CUDA/NCCL paths the CPU test suite cannot reach, in one run (<= 9 minutes on one H200: the part
# timeouts add up to 520 s).
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

# name | seconds | needs (gpu: 1 GPU) | command
PARTS=(
  "pipeline_cuda0|40|gpu|$PY project/run_pipeline.py --model_parallel_mode pipeline_parallel --devices cuda:0,cuda:0 --n_chunk 4 $TINY --out_dir $OUT/pipeline"
  "model_parallel_cuda0_bf16_ckpt|40|gpu|$PY project/run_pipeline.py --model_parallel_mode model_parallel --devices cuda:0,cuda:0 --precision bf16 --grad_ckpt $TINY --out_dir $OUT/mp"
  "pipeline_fp16_gradscaler|40|gpu|$PY project/run_pipeline.py --model_parallel_mode pipeline_parallel --precision fp16 $TINY --out_dir $OUT/pp_fp16"
  "data_parallel_nccl_resume|60|gpu|$PY project/run_data_parallel.py --world_size 1 --backend nccl --save_every 2 --max_steps 3 $TINY --out_dir $OUT/dp && $PY project/run_data_parallel.py --world_size 1 --backend nccl --resume $OUT/dp/checkpoints $TINY --out_dir $OUT/dp"
  "zero2_nccl_one_rank|50|gpu|$PY project/run_finetune.py --world_size 1 --backend nccl --micro_batch 8 $TINY --out_dir $OUT/zero2"
  "zero2_fp16_config|50|gpu|$PY project/run_finetune.py --world_size 1 --backend nccl --precision fp16 --micro_batch 8 $TINY --out_dir $OUT/zero2_fp16"
  "zero3_offload_nccl|50|gpu|$PY project/run_finetune.py --world_size 1 --backend nccl --zero_stage 3 --offload cpu --micro_batch 8 $TINY --out_dir $OUT/zero3"
  "benchmark_gpu_quick|90|gpu|$PY scripts/run_benchmarks.py --quick --workdir $W --figures_dir $OUT/figures"
  "grade_problem_1_2|60|gpu|$PY -m grading grade --problem 1.2"
  # Problem 4 on one CUDA rank (CLAUSES.md, Problem 4 prose): ZeRO-1 master shard on the parameters' device,
  # model.pt with CPU tensors of a CUDA model, load_sharded back onto CUDA.
  "problem4_cuda|40|gpu|$PY -m grading.problems.p4_3_checkpoint.cuda_check"
)

have_gpu() {
  "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() and torch.cuda.device_count() > 0 else 1)" \
    2>/dev/null
}

cd "$ROOT" || exit 1
mkdir -p "$OUT"
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
