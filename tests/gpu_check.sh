#!/usr/bin/env bash
# Every check that needs a CUDA GPU, one line each (PASSED / FAILED / SKIPPED with its reason), in under
# 8 minutes on one GPU: nccl with one rank, the real torch.nn.parallel primitives against the CPU emulation,
# autocast fp16/bf16 with GradScaler, SyncBatchNorm on one rank, two processes sharing one GPU on gloo,
# the benchmark's GPU section, the examples/ scripts under torchrun on nccl (fp16 too); checks that need two GPUs
# say so and skip. Only the test files that hold GPU checks are collected: the others import the notebook tools
# (nbval, nbclient), which a GPU machine's own Python may lack. GPU_CHECK_LOG=FILE keeps the whole output.
set -uo pipefail
cd "$(dirname "$0")/.."
python3 -c "import torch; print('torch', torch.__version__, '| GPUs:', torch.cuda.device_count(),
      *(torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())))"
files=$(grep -l "pytest.mark.gpu" tests/test_*.py)
# shellcheck disable=SC2086
timeout 480 python3 -m pytest $files -m gpu -q -rA -p no:randomly -o addopts="" --no-header 2>&1 \
    | tee "${GPU_CHECK_LOG:-/dev/null}" | grep -E "^(PASSED|FAILED|SKIPPED|ERROR)|passed|failed"
exit "${PIPESTATUS[0]}"
