#!/usr/bin/env bash
# replicas: 8. Start 8 copies of this server, each on its own 1 card(s) (HPU_VISIBLE_DEVICES) and port, behind a round-robin balancer.
# vLLM on Intel Gaudi (vllm-gaudi): Qwen/Qwen3-32B, as planned by python -m pipeline.plan.
# The model: a Hugging Face id or folder.
set -euo pipefail
# The bucket sets the simulation prepared, exactly, from the file beside this one:
# prompt (batch, query tokens, blocks), decode (batch, 1, blocks of all rows). The
# prompt's third axis here counts the chunk's blocks with its context's.
export VLLM_BUCKETING_FROM_FILE="$(dirname "$0")/vllm-buckets.txt"
export VLLM_SKIP_WARMUP=false
# Without file support, these ranges come closest; vLLM's linear ranges double from
# MIN up to STEP first, so they are not the same sets. VLLM_EXPONENTIAL_BUCKETING is
# deprecated (it overrides VLLM_BUCKETING_STRATEGY) and is left unset.
# export VLLM_BUCKETING_STRATEGY=exp
# export VLLM_PROMPT_BS_BUCKET_MIN=1
# export VLLM_PROMPT_BS_BUCKET_STEP=1
# export VLLM_PROMPT_BS_BUCKET_MAX=64
# export VLLM_PROMPT_QUERY_BUCKET_MIN=128
# export VLLM_PROMPT_QUERY_BUCKET_STEP=128
# export VLLM_PROMPT_QUERY_BUCKET_MAX=2048
# export VLLM_PROMPT_CTX_BUCKET_MIN=1
# export VLLM_PROMPT_CTX_BUCKET_STEP=1
# export VLLM_PROMPT_CTX_BUCKET_MAX=80
# export VLLM_DECODE_BS_BUCKET_MIN=1
# export VLLM_DECODE_BS_BUCKET_STEP=1
# export VLLM_DECODE_BS_BUCKET_MAX=64
# export VLLM_DECODE_BLOCK_BUCKET_MIN=1
# export VLLM_DECODE_BLOCK_BUCKET_STEP=1
# export VLLM_DECODE_BLOCK_BUCKET_MAX=5120
exec vllm serve Qwen/Qwen3-32B \
  --tensor-parallel-size 1 \
  --max-model-len 10240 \
  --max-num-seqs 64 \
  --block-size 128 \
  --max-num-batched-tokens 2048 \
  --enable-chunked-prefill \
  --enable-prefix-caching
