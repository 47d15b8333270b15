"""The pipeline stages: tokenizer, scheduler, metadata, attention, sampler, model, workload."""
