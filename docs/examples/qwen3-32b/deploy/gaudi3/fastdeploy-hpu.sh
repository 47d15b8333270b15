#!/usr/bin/env bash
# replicas: 8. Start 8 copies of this server, each on its own 1 card(s) (HPU_VISIBLE_DEVICES) and port, behind a round-robin balancer.
# FastDeploy on Intel Gaudi: Qwen/Qwen3-32B, as planned by python -m pipeline.plan.
# --model: the Paddle checkpoint (folder or id).
set -euo pipefail
export FD_ATTENTION_BACKEND=HPU_ATTN
export HPU_WARMUP_BUCKET=1
export HPU_WARMUP_MODEL_LEN=10240
export PADDLE_DISTRI_BACKEND=xccl
export PADDLE_XCCL_BACKEND=intel_hpu
# Bucket sets: FastDeploy's HPU runner derives its own; the simulated ones are in
# vllm-buckets.txt (no FastDeploy setting takes them).
exec python -m fastdeploy.entrypoints.openai.api_server \
  --model Qwen/Qwen3-32B \
  --tensor-parallel-size 1 \
  --max-model-len 10240 \
  --max-num-seqs 64 \
  --block-size 128 \
  --max-num-batched-tokens 2048 \
  --enable-chunked-prefill \
  --enable-prefix-caching \
  --graph-optimization-config '{"use_cudagraph":false}'
