"""The built book loads nothing from the network: every script, style sheet, font and image a
page asks for at load time comes from the book itself, so it reads the same offline (formulas
typeset, not raw ``\\(B_M \\times B_N\\)``).

How this guards every page in CI: ``.ci/run`` runs ``make test`` before ``make book``, so
there is no ``_build/html`` to scan yet. The notebooks are never executed by the book
(``execute_notebooks: off``), so a whole build takes seconds (6-8 s on an idle 2-core
machine, 6-10 s of CPU): the fixture builds the real book, with the real ``_config.yml``
and ``_toc.yml``, into a temporary folder, and the tests scan every page and every style
sheet of that build. Warnings are not errors here (``make book`` runs with ``-W``); this file
only judges what the pages load.

Links (``<a href>``) to GitHub, Colab or Binder are navigation, not resources, and are fine.
Scripts that fetch only when the reader clicks something (sphinx-thebe's ``THEBE_JS_URL``,
for a "live code" button the book does not enable) are not page loads either. What a page
does once its scripts run is checked in a real browser by ``scripts/check_book_offline.sh``
(headless Chromium, network cut off, every request a page makes listed; not part of CI).
"""

import html
import json
import re
import subprocess
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
MATHJAX = "_static/mathjax/es5/tex-mml-chtml.js"     # in the built book (_config.yml)
REMOTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:)?//", re.I)   # http://, https://, //host
CSS_REMOTE = re.compile(r"""(?:@import\s+(?:url\()?|url\()\s*["']?\s*((?:[a-z][a-z0-9+.-]*:)?//[^"')\s;]*)""",
                        re.I)
# <link rel=...> values that are navigation or metadata, not something the browser fetches.
NAV_RELS = {"next", "prev", "previous", "index", "search", "canonical", "alternate", "author",
            "license", "help", "bookmark", "nofollow", "noopener", "noreferrer", "external",
            "me", "tag", "first", "last", "up", "top", "contents", "copyright", "glossary"}
# Attributes that make the browser fetch something as soon as the page loads.
FETCHING = {("script", "src"), ("img", "src"), ("img", "srcset"), ("iframe", "src"),
            ("audio", "src"), ("video", "src"), ("video", "poster"), ("source", "src"),
            ("source", "srcset"), ("track", "src"), ("embed", "src"), ("object", "data"),
            ("input", "src"), ("image", "href"), ("use", "href"), ("frame", "src")}


@pytest.fixture(scope="module")
def book(tmp_path_factory):
    """The book built from this checkout into a temporary folder: its ``_build/html``."""
    pytest.importorskip("jupyter_book")
    out = tmp_path_factory.mktemp("book")
    cmd = [sys.executable, "-c",
           "import sys; from jupyter_book.cli.main import main; sys.exit(main())",
           "build", str(ROOT), "--path-output", str(out), "--keep-going"]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, f"jupyter-book build failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    html_dir = out / "_build" / "html"
    assert (html_dir / "index.html").is_file()
    return html_dir


@pytest.fixture(scope="module")
def pages(book):
    """{page: (its text, what it loads)} for every page of the build (not theme templates)."""
    found = sorted(p for p in book.rglob("*.html")
                   if not {"_static", "_sources"} & set(p.relative_to(book).parts))
    assert len(found) >= 10, found
    out = {}
    for page in found:
        text = page.read_text(encoding="utf-8")
        parsed = _Resources()
        parsed.feed(text)
        out[page] = (text, parsed)
    return out


class _Resources(HTMLParser):
    """(description, url) of everything a page fetches at load time, from tags and styles."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.found, self.scripts = [], []
        self._in_style = False

    def handle_starttag(self, tag, attrs):
        a = {k: (v or "") for k, v in attrs}
        if tag == "script" and a.get("src"):
            self.scripts.append(a["src"])
        for (t, attr) in FETCHING:
            if t == tag and attr in a:
                urls = [u.strip().split()[0] for u in a[attr].split(",") if u.strip()] \
                    if attr == "srcset" else [a[attr]]
                self.found += [(f"<{tag} {attr}=...>", u) for u in urls]
        if tag == "link" and "href" in a:
            rels = set(a.get("rel", "").lower().split())
            if not rels or rels - NAV_RELS:              # stylesheet, preload, icon, preconnect...
                self.found.append((f"<link rel={a.get('rel', '')!r}>", a["href"]))
        if "style" in a:
            self.found += [(f"<{tag} style=...>", u) for u in CSS_REMOTE.findall(a["style"])]
        self._in_style = tag == "style"

    def handle_endtag(self, tag):
        if tag == "style":
            self._in_style = False

    def handle_data(self, data):
        if self._in_style:
            self.found += [("<style> block", u) for u in CSS_REMOTE.findall(data)]


def test_no_page_loads_anything_remote(book, pages):
    bad = []
    for page, (_, parsed) in pages.items():
        for what, url in parsed.found:
            if REMOTE.match(url):
                bad.append(f"{page.relative_to(book)}: {what} {url}")
    assert not bad, "pages load remote resources (the book must work offline):\n" + "\n".join(bad)


def test_no_style_sheet_loads_anything_remote(book):
    sheets = sorted(book.rglob("*.css"))
    assert sheets
    bad = [f"{css.relative_to(book)}: {u}" for css in sheets
           for u in CSS_REMOTE.findall(css.read_text(encoding="utf-8", errors="replace"))]
    assert not bad, "style sheets import remote resources:\n" + "\n".join(bad)


def test_every_local_resource_exists(book, pages):
    """What the pages load locally is in the build (a wrong mathjax_path would 404 offline)."""
    missing = []
    for page, (_, parsed) in pages.items():
        for what, url in parsed.found:
            if REMOTE.match(url) or url.startswith(("data:", "#", "javascript:")) or not url:
                continue
            target = (page.parent / url.split("?")[0].split("#")[0]).resolve()
            if not target.exists():
                missing.append(f"{page.relative_to(book)}: {what} {url}")
    assert not missing, "\n".join(missing)


def test_mathjax_is_served_by_the_book(book, pages):
    js = book / MATHJAX
    assert js.is_file(), "MathJax is not in the built book (_config.yml: html_extra_path, mathjax_path)"
    fonts = js.parent / "output" / "chtml" / "fonts" / "woff-v2"
    assert (fonts / "MathJax_Main-Regular.woff").is_file() and (fonts / "MathJax_Math-Italic.woff").is_file()
    assert "Apache License" in (book / "_static" / "mathjax" / "LICENSE").read_text()
    with_math = 0
    for page, (text, parsed) in pages.items():
        loads = [s for s in parsed.scripts if "mathjax" in s.lower() or "tex-mml" in s]
        if 'class="math' in text:
            with_math += 1
            assert len(loads) == 1, f"{page.relative_to(book)}: MathJax scripts {loads}"
        for s in loads:
            assert (page.parent / s.split("?")[0]).resolve() == js.resolve(), (page, s)
    assert with_math >= 5, "expected formulas on several pages"


def _autoload(js: Path):
    """MathJax's on-demand TeX packages: {package: (macros, environments)}, minus preloaded ones."""
    text = js.read_text(encoding="utf-8")
    m = re.search(r"autoload:\(0,\w+\.expandable\)\((\{[^{}]*\})\)", text)
    pre = re.search(r'preLoad\("input/tex-base",([^)]*)\)', text)
    assert m and pre, "MathJax's autoload table not found (was tex-mml-chtml.js replaced?)"
    table = json.loads(re.sub(r"([{,])(\w+):", r'\1"\2":', m.group(1)))
    preloaded = set(re.findall(r'"\[tex\]/(\w+)"', pre.group(1)))
    out = {}
    for pkg, v in table.items():
        if pkg in preloaded:
            continue
        macros, envs = (v if len(v) == 2 and isinstance(v[0], list) else (v, []))
        out[pkg] = (set(macros), set(envs))
    assert "boldsymbol" in out and "newcommand" not in out
    return out


def test_formulas_need_no_mathjax_extension_the_book_lacks(book, pages):
    """MathJax fetches some TeX packages when a formula first uses them (``\\boldsymbol``,
    ``\\color``, ``\\cancel``...). Only the combined component is shipped, so a formula that
    needs one would fail offline: then copy the package's file (see the README beside it)."""
    js = book / MATHJAX
    ext_dir = js.parent / "input" / "tex" / "extensions"
    need = _autoload(js)
    bad = []
    for page, (raw, _) in pages.items():
        for _, body in re.findall(r'<(span|div) class="math[^"]*">(.*?)</\1>', raw, re.S):
            tex = html.unescape(body)
            macros = set(re.findall(r"\\([A-Za-z]+)", tex))
            envs = set(re.findall(r"\\begin\{(\w+)\}", tex))
            for pkg, (pm, pe) in need.items():
                used = (macros & pm) | (envs & pe)
                if used and not (ext_dir / f"{pkg}.js").is_file():
                    bad.append(f"{page.relative_to(book)}: {sorted(used)} need MathJax's "
                               f"[tex]/{pkg} extension")
    assert not bad, "\n".join(sorted(set(bad)))


def test_scanner_sees_remote_resources(tmp_path):
    """The checks above would notice what the CDN MathJax looked like, and other loads."""
    page = tmp_path / "p.html"
    page.write_text(
        '<html><head><script defer src="https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js">'
        '</script><link rel="stylesheet" href="//fonts.example/x.css">'
        '<link rel="preload" as="font" href="https://x/y.woff2"><link rel="next" href="https://n">'
        '<style>@import url("https://fonts.googleapis.com/css?family=Lato");</style></head>'
        '<body><a href="https://github.com/x">fine</a><img srcset="a.png 1x, https://i/b.png 2x">'
        '<div style="background:url(https://i/c.png)"></div></body></html>')
    parsed = _Resources()
    parsed.feed(page.read_text())
    remote = [u for _, u in parsed.found if REMOTE.match(u)]
    assert remote == ["https://cdn.jsdelivr.net/npm/mathjax@3/es5/tex-mml-chtml.js",
                      "//fonts.example/x.css", "https://x/y.woff2",
                      "https://fonts.googleapis.com/css?family=Lato", "https://i/b.png",
                      "https://i/c.png"], remote
    assert CSS_REMOTE.findall("a{b:url(data:x)} @import 'https://z/a.css'; c{d:url( 'http://q' )}") \
        == ["https://z/a.css", "http://q"]
