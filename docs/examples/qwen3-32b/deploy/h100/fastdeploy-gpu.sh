#!/usr/bin/env bash
# FastDeploy (GPU): Qwen/Qwen3-32B, as planned by python -m pipeline.plan.
# replicas: 4. Start 4 copies of this server, each on its own 2 card(s) (CUDA_VISIBLE_DEVICES) and port, behind a round-robin balancer.
# Flag names as read from: PaddlePaddle/FastDeploy docs/parameters.md; PaddlePaddle/FastDeploy docs/quantization/online_quantization.md.
set -euo pipefail
exec python -m fastdeploy.entrypoints.openai.api_server --model Qwen/Qwen3-32B \
  --tensor-parallel-size 2 \
  --max-num-seqs 64 \
  --max-num-batched-tokens 2048 \
  --max-model-len 10240 \
  --block-size 128 \
  --enable-chunked-prefill \
  --enable-prefix-caching \
  --gpu-memory-utilization 0.9
