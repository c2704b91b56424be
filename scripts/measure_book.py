"""Read the built book as a reader's browser shows it: headless Chromium at 1280 px.

For every page of ``_build/html``: its height, the code/output blocks that scroll sideways (collapsed ones not counted),
the tables wider than the text column, and each figure's display scale (shown width over
the PNG's own width; a figure drawn at the book's width shows at about 1.0).

    make book && python scripts/measure_book.py [--json out.json]

Needs Chromium and chromedriver (Debian: chromium, chromium-driver) and selenium.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
JS = """
// The text column: the article's content box (its padding excluded), the width a cell's
// output and a table have before they overflow -- not <main>, which holds the page's
// table of contents too.
const col = ['article.bd-article', '.bd-article', 'article', 'main']
    .map(s => document.querySelector(s)).find(e => e) || document.body;
const pad = getComputedStyle(col);
const colW = col.clientWidth - parseFloat(pad.paddingLeft) - parseFloat(pad.paddingRight);
const shown = e => e.offsetParent !== null && e.getBoundingClientRect().width > 0
    && !e.closest('details:not([open])');
const scrollers = [...document.querySelectorAll('pre, div.output, .cell_output')]
    .filter(e => shown(e) && e.scrollWidth > e.clientWidth + 2).length;
const tables = [...document.querySelectorAll('table')].filter(shown)
    .map(t => Math.max(t.scrollWidth, t.getBoundingClientRect().width));
const wide = tables.filter(w => w > colW + 2).length;
const widest = Math.round(Math.max(0, ...tables));
const imgs = [...document.querySelectorAll('img')].filter(i => i.naturalWidth > 0 && shown(i))
    .map(i => ({src: i.getAttribute('src').slice(0, 60), natural: i.naturalWidth,
                shown: Math.round(i.getBoundingClientRect().width)}));
return {height: document.documentElement.scrollHeight, column: Math.round(colW),
        scrolling_blocks: scrollers, wide_tables: wide, widest_table: widest, images: imgs};
"""


def main() -> int:
    from selenium import webdriver

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--html", default=str(ROOT / "_build" / "html"))
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--window-size=1280,900"):
        opts.add_argument(flag)
    opts.binary_location = "/usr/bin/chromium"
    driver = webdriver.Chrome(service=webdriver.ChromeService("/usr/bin/chromedriver"),
                              options=opts)
    pages = {}
    try:
        html = Path(args.html)
        for page in sorted(html.glob("chapters/*.html")) + [html / "intro.html"]:
            driver.get(page.as_uri())
            r = driver.execute_script(JS)
            for im in r["images"]:
                im["scale"] = round(im["shown"] / im["natural"], 3)
            pages[page.relative_to(html).as_posix()] = r
    finally:
        driver.quit()
    for name, r in sorted(pages.items(), key=lambda kv: -kv[1]["height"]):
        small = min((im["scale"] for im in r["images"]), default=None)
        print(f"{name:45} {r['height']:7d} px  sideways {r['scrolling_blocks']:3d}  "
              f"wide tables {r['wide_tables']:2d} (widest {r['widest_table']:4d} of "
              f"{r['column']})  images {len(r['images']):3d}  "
              f"smallest scale {small if small is not None else '-'}")
    if args.json:
        Path(args.json).write_text(json.dumps(pages, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
