"""benchmarks.vs_llamacpp's ratios against the issue's goals, on hand-made figures."""

from __future__ import annotations

from benchmarks.vs_llamacpp import ratio_lines


def rate(tok_s: float) -> dict:
    return {"tok_s": tok_s}


def test_ratios_set_each_engine_side_against_llamacpp_and_transformers_at_its_best():
    best = {
        ("this engine", 1): rate(20.0),
        ("this engine", 8): rate(120.0),
        ("llama.cpp", 1): rate(100.0),
        ("transformers", 1): rate(10.0),
        ("transformers", 8): rate(30.0),
    }
    (line,) = ratio_lines(best, 8)
    assert "one stream / llama.cpp's = **0.20x**" in line  # 20 / 100
    assert "8 streams / llama.cpp's one stream = **1.20x**" in line  # 120 / 100
    assert "transformers at its best / this side at its best = **0.25x**" in line  # 30 / 120


def test_without_llamacpp_or_transformers_their_ratios_are_left_out():
    best = {("this engine", 1): rate(20.0), ("this engine", 8): rate(120.0)}
    (missing,) = ratio_lines(best, 8)
    assert "llama.cpp was not measured" in missing
