#!/usr/bin/env bash
# TensorRT-LLM (trtllm-serve, PyTorch backend): Qwen/Qwen3-32B, as planned by python -m pipeline.plan.
# replicas: 4. Start 4 copies of this server, each on its own 2 card(s) (CUDA_VISIBLE_DEVICES) and port, behind a round-robin balancer.
# Flag names as read from: NVIDIA/TensorRT-LLM docs/source/commands/trtllm-serve (1.0: trtllm-serve --help); NVIDIA/TensorRT-LLM tensorrt_llm/llmapi/llm_args.py (LlmArgs, KvCacheConfig).
set -euo pipefail
exec trtllm-serve Qwen/Qwen3-32B \
  --tp_size 2 \
  --max_batch_size 64 \
  --max_num_tokens 2048 \
  --max_seq_len 10240 \
  --kv_cache_free_gpu_memory_fraction 0.9 \
  --extra_llm_api_options "$(dirname "$0")/trtllm-options.yaml"
