"""report.html: one self-contained page per sweep (pipeline/summary/page.py) and per plan
(pipeline/plan/page.py), beside summary.md and plan.md; this package holds what both
pages share: the page and its tables (document.py), the charts (charts.py) and the one
rule of every value axis, which summary.png follows too (axes.py).

The page opens offline: its styles, its table-sorting script and Bokeh's own script are
inline, the charts are Bokeh's (pipeline/page/charts.py), the page around them a Jinja2
template (page.html.j2). Why Bokeh (docs/sweeps.md): a page holds its core script only
(about 1.3 MB, where Plotly's is about 4.8 MB and Altair needs Vega, Vega-Lite and a
converter to inline them), and it has hover, tap-to-open-a-link and whiskers as models, so
the page carries no hand-written chart code.
"""

REPORT_HTML = "report.html"
