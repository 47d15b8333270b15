#!/usr/bin/env bash
# vLLM (CUDA): Qwen/Qwen3-32B, as planned by python -m pipeline.plan.
# replicas: 4. Start 4 copies of this server, each on its own 2 card(s) (CUDA_VISIBLE_DEVICES) and port, behind a round-robin balancer.
# Flag names as read from: vllm-project/vllm docs/cli/serve.md; vllm-project/vllm docs/configuration/engine_args.md (vllm/engine/arg_utils.py).
set -euo pipefail
exec vllm serve Qwen/Qwen3-32B \
  --tensor-parallel-size 2 \
  --max-num-seqs 64 \
  --max-num-batched-tokens 2048 \
  --max-model-len 10240 \
  --block-size 128 \
  --enable-chunked-prefill \
  --enable-prefix-caching \
  --gpu-memory-utilization 0.9
