"""scheduler=static: batches prefilled together, decoded in lockstep, nothing admitted until a
batch is done; on the real path its tokens and logits are the dense reference's."""

from __future__ import annotations

from tests.conftest import serve
from tests.test_oracle import assert_matches

STATIC = ["scheduler=static", "max_tokens=4096", "max_num_seqs=4"]


def test_static_batches_match_the_dense_reference(reference_run):
    got, engine = serve(STATIC, record_logits=True)
    assert_matches(reference_run, got, engine)


def test_batches_are_prefilled_together_and_run_to_their_end():
    steps: list = []
    got, _ = serve([*STATIC, "workload.num_requests=10"], steps=steps)
    found = static_batches(steps, got)
    assert [len(b) for b in found] == [4, 4, 2]
    assert set().union(*found) == set(got)


def static_batches(steps, got) -> list[set[str]]:
    """Batches from the steps alone: a prefill step starts one; every decode step until the
    next prefill runs only that batch's requests, and the next prefill comes only after
    each of them has produced all its tokens."""
    found: list[set[str]] = []
    decoded: dict[str, int] = {}
    for step in steps:
        prefilled = {c["id"] for c in step.prefill}
        if prefilled:
            assert not step.decode, "a prefill shared a step with decodes"
            if found:
                unfinished = [r for r in found[-1] if decoded[r] + 1 < len(got[r].output_ids)]
                assert not unfinished, f"admitted while {unfinished} still decode"
            found.append(prefilled)
            decoded.update(dict.fromkeys(prefilled, 0))
        else:
            assert set(step.decode) <= found[-1]
            for rid in step.decode:
                decoded[rid] += 1
    return found


def test_a_batch_is_only_as_large_as_the_pool_holds_to_its_end():
    # 18 blocks of 16 tokens: a request of up to 120 + 10 tokens needs up to 9 of them.
    steps: list = []
    got, _ = serve([*STATIC, "num_blocks=18", "workload.num_requests=6"], steps=steps)
    assert sum(r.num_preemptions for r in got.values()) == 0
    assert all(r.finish_reason != "error" for r in got.values())
    sizes = []
    for batch in static_batches(steps, got):
        need = [-(-(len(got[r].prompt_ids) + got[r].max_new_tokens) // 16) for r in batch]
        assert sum(need) <= 18
        sizes.append(len(batch))
    assert min(sizes) < 4  # the pool, not max_num_seqs, bounded some batch


def test_a_simulated_static_run_schedules_as_the_real_one():
    from tests.test_simulated import SIMULATED, plans

    real_steps, sim_steps = [], []
    serve([*STATIC, "workload.num_requests=9"], steps=real_steps)
    serve([*STATIC, "workload.num_requests=9", *SIMULATED], steps=sim_steps)
    assert plans(sim_steps) == plans(real_steps) and len(real_steps) > 3


def test_no_evict_admits_only_what_the_pool_holds_to_the_end():
    from tests.test_simulated import WORKLOAD

    tight = [*WORKLOAD, "max_tokens=32", "num_blocks=14"]
    evicting, _ = serve(tight)
    assert sum(r.num_preemptions for r in evicting.values()) > 0, "nothing to avoid"
    kept, _ = serve([*tight, "scheduler.no_evict=true"])
    assert sum(r.num_preemptions for r in kept.values()) == 0
    assert {k: r.output_ids for k, r in kept.items()} == {
        k: r.output_ids for k, r in evicting.items()
    }
