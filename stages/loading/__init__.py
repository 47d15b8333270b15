"""Loading a model from files: checkpoint/ (safetensors folders), gguf/ (GGUF files),
tokenizer (byte, Hugging Face and GGUF tokenizers), chat and template_worker (chat
templates, rendered in a worker process)."""
