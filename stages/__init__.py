"""The pipeline stages, one package per job: scheduling (scheduler, KV-cache manager),
forward (forward metadata and buckets), model (decoder, model description, attention),
sampling, loading (checkpoints, GGUF, tokenizers), workload and trace (the requests a run
serves), simulator (a simulated device); interfaces.py holds the contracts between them."""
