#!/usr/bin/env bash
# SGLang: Qwen/Qwen3-32B, as planned by python -m pipeline.plan.
# replicas: 4. Start 4 copies of this server, each on its own 2 card(s) (CUDA_VISIBLE_DEVICES) and port, behind a round-robin balancer.
# Flag names as read from: sgl-project/sglang docs/advanced_features/server_arguments.md.
set -euo pipefail
exec python -m sglang.launch_server --model-path Qwen/Qwen3-32B \
  --tp-size 2 \
  --max-running-requests 64 \
  --max-prefill-tokens 2048 \
  --context-length 10240 \
  --page-size 128 \
  --chunked-prefill-size 2048 \
  --mem-fraction-static 0.9
