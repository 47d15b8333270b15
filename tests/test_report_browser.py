"""report.html in a real browser: Debian's Chromium, headless, every network request
refused, loads the page of a small sweep and of a small plan with no script error, draws
its charts, and its screenshot is a page, not a blank."""

from __future__ import annotations

import pytest

from pipeline.page import REPORT_HTML
from tests.browser import distinct_colours, needs_chromium, open_page
from tests.helpers import TINY_RUN, run_cli
from tests.test_report_page import parsed, small_plan, small_sweep

pytestmark = needs_chromium


def check(opened, size: tuple[int, int]) -> None:
    assert not opened.troubles, opened.troubles
    assert "data-script-errors" not in opened.dom.split(">", 2)[1]  # the <html> tag's own
    # Bokeh drew into the charts' root: its layout element is there
    assert 'data-root-id="' in opened.dom and 'class="bk-Column"' in opened.dom
    shot_size, colours, inked = distinct_colours(opened.screenshot)
    assert shot_size == size
    assert colours > 50 and 0.03 < inked < 0.9, (colours, inked)


def test_the_sweep_page_loads_offline_with_no_script_error(tmp_path):
    page = small_sweep(tmp_path / "sweep")
    opened = open_page(page, tmp_path)
    check(opened, (1400, 2200))
    # every job's row and its overrides, as the browser holds them
    for num, block in enumerate((64, 128, 256)):
        assert f'id="job-{num}"' in opened.dom and f"block_size={block}" in opened.dom
    assert "is a tie within their bands" in opened.dom


def test_the_plan_page_loads_offline_with_no_script_error(tmp_path):
    page = small_plan(tmp_path / "plan")
    opened = open_page(page, tmp_path / "browser")
    check(opened, (1400, 2200))
    assert sorted(parsed(page).rows) == ["job-0", "job-1"]
    assert "Best: job 1 on gaudi2" in opened.dom


def test_a_failing_script_is_caught(tmp_path):
    """The check can fail: a page whose script throws is reported."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><p>x</p><script>undefinedName();</script></body></html>")
    opened = open_page(page, tmp_path)
    assert any("undefinedName" in line for line in opened.troubles)


@pytest.mark.slow
def test_the_pages_the_commands_write_open_in_chromium(tmp_path):
    """`python -m pipeline -m ...` and `python -m pipeline.plan ...` as a user types them:
    each page opens offline without a script error and holds every job."""
    sweep, plan = tmp_path / "sweep", tmp_path / "plan"
    simulated = ["executor=simulated", "hardware=gaudi2", "model=spec/llama31_8b"]
    done = run_cli(tmp_path, "pipeline", "-m", f"hydra.sweep.dir={sweep}", *simulated,
                   "max_tokens=64,128", *TINY_RUN)  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    done = run_cli(
        tmp_path, "pipeline.plan", *simulated[1:], "max_model_len=1024", "max_num_seqs=8",
        "max_tokens=256,512", "workload.num_requests=12", "workload.max_prompt_tokens=400",
        "workload.max_new_tokens=20", "slo.ttft_ms=500", "slo.tpot_ms=40",
        "capacity.max_probes=3", "capacity.tolerance=0.5", "capacity.sustained=false",
        f"hydra.sweep.dir={plan}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    for folder, title in ((sweep, "Sweep"), (plan, "Plan")):
        opened = open_page(folder / REPORT_HTML, tmp_path / title)
        check(opened, (1400, 2200))
        assert f"<title>{title} " in opened.dom
        assert sorted(parsed(folder / REPORT_HTML).rows) == ["job-0", "job-1"]
