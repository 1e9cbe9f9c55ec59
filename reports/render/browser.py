"""report.html in a real browser (headless Chromium): what a user sees, checked and photographed.

    python -m reports.render.browser check results/report.html
    python -m reports.render.browser screenshot results/report.html docs/report.png

`check` loads a copy of the page with a short script added at its end that, once the page has
loaded, reports for every section heading (h2) whether it is laid out, for every image whether
it decoded (naturalWidth > 0) and was laid out, and where the answer table and the first figure
end (px from the top, against the window's height: "above the fold"). Chromium prints the
resulting DOM (`--dump-dom`), from which the report is read. `screenshot` writes a PNG of the top
of the page at the window size given (1400 x 900 by default: a laptop's first screen).

Chromium runs with a fresh, empty profile in a temporary folder and no network features; a
missing Chromium is `None` from `chromium()`, and the callers say so in one line.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync",
         "--hide-scrollbars")
WINDOW = (1400, 900)
TIMEOUT_S = 90

PROBE = """<script>
window.addEventListener("load", () => {
  const out = {height: window.innerHeight, width: window.innerWidth, sections: [], images: []};
  for (const h of document.querySelectorAll("h2")) {
    const r = h.getBoundingClientRect();
    out.sections.push({id: h.id, text: h.textContent, shown: r.height > 0 && r.width > 0});
  }
  for (const im of document.querySelectorAll("img")) {
    const r = im.getBoundingClientRect();
    out.images.push({alt: (im.alt || "").slice(0, 80), decoded: im.complete && im.naturalWidth > 0,
                     width: r.width, height: r.height, bottom: r.bottom + window.scrollY});
  }
  const t = document.querySelector("#answer + table");
  out.answer_table_bottom = t ? t.getBoundingClientRect().bottom + window.scrollY : null;
  const f = document.querySelector("#answer ~ figure img");
  out.answer_figure_bottom = f ? f.getBoundingClientRect().bottom + window.scrollY : null;
  const pre = document.createElement("pre");
  pre.id = "ppscope-browser-check";
  pre.textContent = JSON.stringify(out);
  document.body.appendChild(pre);
});
</script>"""


def chromium() -> str | None:
    """The path of a Chromium on PATH, or None."""
    return next((p for p in map(shutil.which, NAMES) if p), None)


def _run(args: list[str], page: Path, size: tuple[int, int]) -> subprocess.CompletedProcess:
    exe = chromium()
    if exe is None:
        raise RuntimeError("no Chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="ppscope-chromium-") as profile:
        return subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}",
                               f"--window-size={size[0]},{size[1]}", *args,
                               page.resolve().as_uri()],
                              capture_output=True, text=True, timeout=TIMEOUT_S)


def check(html: str | Path, size: tuple[int, int] = WINDOW) -> dict:
    """The page as Chromium laid it out (see the module docstring); RuntimeError when Chromium
    printed no result."""
    src = Path(html).read_text()
    with tempfile.TemporaryDirectory(prefix="ppscope-page-") as d:
        page = Path(d) / "report.html"
        page.write_text(src.replace("</body>", PROBE + "</body>", 1))
        r = _run(["--dump-dom", "--virtual-time-budget=5000"], page, size)
    m = re.search(r'<pre id="ppscope-browser-check">(.*?)</pre>', r.stdout, re.S)
    if not m:
        raise RuntimeError(f"Chromium gave no layout (exit {r.returncode}): "
                           f"{r.stderr.strip().splitlines()[-1:] or ''}")
    import html as _html
    return json.loads(_html.unescape(m.group(1)))


def screenshot(html: str | Path, png: str | Path, size: tuple[int, int] = WINDOW) -> Path:
    """A PNG of the top of the page at `size` (width, height) px."""
    png = Path(png).resolve()
    png.parent.mkdir(parents=True, exist_ok=True)
    r = _run([f"--screenshot={png}"], Path(html), size)
    if not png.exists():
        raise RuntimeError(f"Chromium wrote no screenshot (exit {r.returncode})")
    return png


def main(argv: list[str] | None = None) -> int:
    import argparse
    p = argparse.ArgumentParser(prog="python -m reports.render.browser", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("what", choices=("check", "screenshot"))
    p.add_argument("html")
    p.add_argument("png", nargs="?", default="report.png")
    p.add_argument("--size", default=f"{WINDOW[0]}x{WINDOW[1]}", help="WIDTHxHEIGHT px")
    a = p.parse_args(argv)
    size = tuple(int(x) for x in a.size.lower().split("x"))
    if chromium() is None:
        print("no Chromium on PATH (apt-get install chromium)", file=sys.stderr)
        return 2
    if a.what == "check":
        print(json.dumps(check(a.html, size), indent=1))
    else:
        print(screenshot(a.html, a.png, size))
    return 0


if __name__ == "__main__":
    sys.exit(main())
