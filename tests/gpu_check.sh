#!/usr/bin/env bash
# Every check that needs a CUDA GPU, one line each (PASSED / FAILED / SKIPPED with its reason), in under
# 8 minutes on one GPU: nccl with one rank, the real torch.nn.parallel primitives against the CPU emulation,
# autocast fp16/bf16 with GradScaler, SyncBatchNorm on one rank, two processes sharing one GPU on gloo,
# the benchmark's GPU section; checks that need two GPUs say so and skip.
set -uo pipefail
cd "$(dirname "$0")/.."
python -c "import torch; print('torch', torch.__version__, '| GPUs:', torch.cuda.device_count(),
      *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"
timeout 480 python -m pytest tests -m gpu -q -rA -p no:randomly -o addopts="" --no-header 2>&1 \
    | grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed"
exit "${PIPESTATUS[0]}"
