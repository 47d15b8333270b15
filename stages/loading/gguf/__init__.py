"""GGUF files (llama.cpp's format): header, dequantisation, model, tokenizer, chat template."""
