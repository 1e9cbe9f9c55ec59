"""report.html in headless Chromium (reports/render/browser.py): every section laid out, every plot
decoded, and the answer table and the herd drawn above the fold of a 1400 x 900 screen. Skipped
in one line where no Chromium is installed (apt-get install chromium)."""
import re

import pytest

from reports.cli import main
from reports.render.browser import WINDOW, check, chromium

if chromium() is None:
    pytest.skip("no Chromium on PATH (apt-get install chromium)", allow_module_level=True)


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    out = tmp_path_factory.mktemp("report")
    (out / "none").mkdir()
    assert main(["report", "--results", str(out / "none"), "--out", str(out)]) == 0
    html = (out / "report.html").read_text()
    return html, check(out / "report.html")


def test_every_section_and_plot_renders(page):
    html, seen = page
    ids = re.findall(r'<h2 id="([^"]+)"', html)
    shown = {s["id"]: s["shown"] for s in seen["sections"]}
    assert ids and all(shown.get(i) for i in ids), shown
    assert len(seen["sections"]) == html.count("<h2")
    assert len(seen["images"]) == html.count("<img") >= 4
    for im in seen["images"]:
        assert im["decoded"] and im["width"] > 200 and im["height"] > 100, im


def test_answer_and_herd_above_the_fold(page):
    html, seen = page
    assert seen["width"] == WINDOW[0]
    # the screenshot's height (docs/report.png): what a 1400 x 900 first screen shows
    assert 0 < seen["answer_table_bottom"] < seen["answer_figure_bottom"] <= WINDOW[1]
    herd = seen["images"][0]
    assert herd["alt"].startswith("The herd at C=")
