"""The console's table at the end of a run: warmup and cut prompts shown when they matter."""

from __future__ import annotations

from pipeline.job.console import summary_table

BASE = {"num_requests": 4, "num_errors": 0, "output_throughput": 10.0, "bucket_misses": 0}


def test_predicted_warmup_and_graphs_with_a_warning_past_an_hour():
    table = summary_table({**BASE, "warmup_shapes": 29016, "predicted_warmup_s": 290_160.0})
    assert "29,016 graphs, 80.6 h predicted" in table
    assert "WARNING" in table and "over an hour" in table
    short = summary_table({**BASE, "warmup_shapes": 64, "predicted_warmup_s": 640.0})
    assert "64 graphs, 640.0 s predicted" in short and "WARNING" not in short


def test_clipped_and_rejected_prompts_are_shown_only_when_there_are_some():
    counts = {"clipped": 1, "rejected": 2, "requests": 10}
    table = summary_table({**BASE, "max_model_len": 2048, "workload_counts": counts})
    assert "1 clipped, 2 rejected by max_model_len=2048" in table
    clean = {**BASE, "workload_counts": {"clipped": 0, "rejected": 0}}
    assert "prompts cut" not in summary_table(clean)


def test_cut_prompts_are_offered_the_models_own_context_length():
    counts = {"clipped": 3, "rejected": 0, "requests": 10}
    metrics = {**BASE, "max_model_len": 2048, "workload_counts": counts}
    known = summary_table({**metrics, "max_position_embeddings": 131072})
    assert "raise max_model_len (the model allows up to 131,072)" in known
    assert "the model allows" not in summary_table(metrics)  # a model that states none
