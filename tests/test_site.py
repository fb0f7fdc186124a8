"""The book as a reader meets it: built with warnings as errors, served, and rendered in a real browser.

The book is built once per test session (`jupyter-book build . -W` into a temporary folder, so a stale
_build cannot hide warnings) and served on 127.0.0.1. Headless Chromium renders each page and the
checks read the resulting DOM: math typeset by the book's own MathJax (no CDN), figures present,
nothing missing on the server. Keep these tests in this one file: with `pytest -n 2 --dist loadfile`
a file runs on one worker, so the book is built once.
"""

from __future__ import annotations

import functools
import html
import http.server
import json
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
JUPYTER_BOOK = Path(sys.executable).parent / "jupyter-book"
CHROMIUM = next((p for p in (shutil.which("chromium"), "/usr/bin/chromium") if p and Path(p).exists()), None)
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--virtual-time-budget=10000",
    "--window-size=1440,1000",  # a desktop browser: the content column is at its widest, about 790 px
]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _config() -> dict:
    return yaml.safe_load((ROOT / "_config.yml").read_text())


def _toc_files() -> list[str]:
    """Every document of _toc.yml (without suffix), root first, in reading order."""
    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    files = [toc["root"]]

    def walk(entries):
        for entry in entries or []:
            if "file" in entry:
                files.append(entry["file"])
            walk(entry.get("sections"))

    for part in toc.get("parts", []):
        walk(part.get("chapters"))
    walk(toc.get("chapters"))
    return [re.sub(r"\.(md|ipynb)$", "", f) for f in files]


TOC = _toc_files()
CHAPTER_PAGES = [f for f in TOC if f.startswith("chapters/")]
PAGES = TOC  # landing page, notation, every chapter


def test_every_chapter_is_in_the_toc():
    """With only_build_toc_files a notebook missing from _toc.yml would silently be left out of the book."""
    on_disk = sorted(f"chapters/{p.stem}" for p in (ROOT / "chapters").glob("*.ipynb"))
    assert sorted(CHAPTER_PAGES) == on_disk, f"_toc.yml lists {sorted(CHAPTER_PAGES)}, chapters/ holds {on_disk}"


# --- the build -------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def build(tmp_path_factory):
    out = tmp_path_factory.mktemp("book")
    cmd = [str(JUPYTER_BOOK), "build", str(ROOT), "-W", "--path-output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600)
    return proc, out / "_build" / "html"


@pytest.fixture(scope="session")
def site(build):
    proc, html = build
    if proc.returncode != 0:
        pytest.fail("the book did not build with -W: see test_book_builds_with_warnings_as_errors", pytrace=False)
    return html


def test_book_builds_with_warnings_as_errors(build):
    proc, html = build
    log = (proc.stdout + proc.stderr)[-30000:]
    assert proc.returncode == 0, f"`jupyter-book build . -W` failed (exit {proc.returncode}):\n{log}"
    for page in PAGES:
        assert (html / f"{page}.html").is_file(), f"{page}.html was not built"


def test_landing_page_is_the_index(site):
    assert "book/intro.html" in (site / "index.html").read_text()


def test_mathjax_is_served_by_the_book(site):
    """MathJax comes from the book's own static files: math renders with no network."""
    path = _config()["sphinx"]["config"]["mathjax_path"]
    assert "://" not in path, f"mathjax_path {path!r} points outside the book"
    assert (site / "_static" / path).is_file(), f"_static/{path} is not in the build"


@pytest.mark.parametrize("page", PAGES)
def test_no_resource_from_the_network(site, page):
    html = (site / f"{page}.html").read_text()
    scripts = re.findall(r"<script[^>]*\bsrc=\"([^\"]+)\"", html)
    links = [h for tag in re.findall(r"<link[^>]*>", html) if re.search(r"rel=\"(stylesheet|preload|modulepreload)\"", tag)
             for h in re.findall(r"href=\"([^\"]+)\"", tag)]
    remote = [u for u in scripts + links if re.match(r"(https?:)?//", u)]
    assert not remote, f"{page} loads resources from the network: {remote}"


def _colab_url(notebook: str) -> str:
    repo = _config()["repository"]
    slug = urllib.parse.urlparse(repo["url"]).path.strip("/")
    prefix = repo.get("path_to_book") or ""
    path = f"{prefix.strip('/')}/{notebook}" if prefix else notebook
    return f"https://colab.research.google.com/github/{slug}/blob/{repo.get('branch', 'main')}/{path}"


@pytest.mark.parametrize("page", CHAPTER_PAGES)
def test_colab_launch_link(site, page):
    html = (site / f"{page}.html").read_text()
    expected = _colab_url(f"{page}.ipynb")
    found = sorted(set(re.findall(r"https://colab\.research\.google\.com/[^\"]+", html)))
    assert expected in found, f"{page}: expected a Colab link to {expected}, found {found}"


# --- the rendered pages ----------------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    requests: list[tuple[str, int]]

    def log_request(self, code="-", size="-"):
        self.requests.append((self.path, int(code) if str(code).isdigit() else 0))

    def log_message(self, *args):
        pass


@pytest.fixture(scope="session")
def server(site):
    requests: list[tuple[str, int]] = []
    handler = type("Handler", (_Handler,), {"requests": requests})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(handler, directory=str(site)))
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", requests
    httpd.shutdown()
    httpd.server_close()


def _dump_dom(url: str) -> str:
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        proc = subprocess.run(
            [CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", url],
            capture_output=True, text=True, timeout=120,
        )
    assert proc.returncode == 0 and "</html>" in proc.stdout, f"chromium could not render {url}:\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="session")
def doms(server):
    if CHROMIUM is None:
        pytest.skip("chromium not found: the rendered-page checks need it (Debian: `apt-get install chromium`)")
    base, _ = server
    with ThreadPoolExecutor(max_workers=3) as pool:
        rendered = pool.map(_dump_dom, [f"{base}/{page}.html?layout-check" for page in PAGES])
        return dict(zip(PAGES, rendered))


@pytest.mark.parametrize("page", PAGES)
def test_math_is_typeset(doms, page):
    dom = doms[page]
    if 'class="math' not in dom:  # the API reference: docstrings, no formulas
        assert page not in CHAPTER_PAGES, f"{page}: a chapter without math?"
        pytest.skip(f"{page} has no math to typeset")
    assert dom.count("<mjx-container") > 0, f"{page}: no typeset math (MathJax did not run?)"
    assert "<mjx-merror" not in dom, f"{page}: MathJax reports a TeX error: {re.findall(r'<mjx-merror.{0,300}', dom)[:3]}"
    raw = re.findall(r"class=\"math[^\"]*\">\s*(\\[(\[].{0,80})", dom)
    assert not raw, f"{page}: math left as raw TeX: {raw[:3]}"


@pytest.mark.parametrize("page", PAGES)
def test_display_math_fits_the_column_and_shows_no_backslash(doms, page):
    """No equation is wider than the column (clipped or scrolled at the site's width); no escaped underscore shows as '\\'."""
    found = re.search(r'data-wide-math="([^"]*)"', doms[page])
    assert found, f"{page}: the layout check did not run (book/_static/layout-check.js)"
    wide = json.loads(html.unescape(found.group(1)))
    assert not wide, f"{page}: display math wider than its column (index, width, room in px): {wide}"
    backslashes = doms[page].count('class="mjx-c5C"') + doms[page].count("class=\"mjx-c5C ")
    assert backslashes == 0, f"{page}: rendered math shows {backslashes} literal backslash(es) (an escaped _ inside math?)"


@pytest.mark.parametrize("page", PAGES)
def test_images_exist(doms, site, server, page):
    base, _ = server
    url = f"{base}/{page}.html"
    sources = re.findall(r"<img[^>]*\bsrc=\"([^\"]+)\"", doms[page])
    pngs = []
    for src in sources:
        target = urllib.parse.urljoin(url, src)
        assert target.startswith(base), f"{page}: image from outside the book: {src}"
        file = site / urllib.parse.unquote(urllib.parse.urlparse(target).path).lstrip("/")
        assert file.is_file(), f"{page}: image {src} is not in the build"
        if file.suffix == ".png":
            assert file.read_bytes()[:8] == PNG_MAGIC, f"{page}: {src} is not a PNG"
            pngs.append(src)
    if page in CHAPTER_PAGES:
        assert pngs, f"{page}: no PNG figure on the page"


def test_nothing_missing_on_the_server(doms, server):
    """Every request the pages made (MathJax extensions and fonts included) was found."""
    _, requests = server
    missing = sorted({path for path, code in requests if code >= 400 and not path.startswith("/favicon.ico")})
    assert not missing, f"requests that failed: {missing}"


# --- the examples in README.md and on the landing page -----------------------------------------------------


@pytest.mark.parametrize("doc", ["README.md", "book/intro.md"])
def test_python_examples_run(doc):
    blocks = re.findall(r"```python\n(.*?)```", (ROOT / doc).read_text(), re.S)
    assert blocks, f"{doc} has no python example"
    for block in blocks:
        exec(compile(block, f"{doc} example", "exec"), {"__name__": "example"})


def test_readme_points_at_the_configured_repository():
    """_config.yml holds the repository URL; the README's Colab and pip lines must name the same one."""
    repo = _config()["repository"]
    slug = urllib.parse.urlparse(repo["url"]).path.strip("/")
    readme = (ROOT / "README.md").read_text()
    colab = set(re.findall(r"colab\.research\.google\.com/github/([\w.-]+/[\w.-]+/blob/[\w.-]+)/", readme))
    pip = set(re.findall(r"git\+https://github\.com/([\w.-]+/[\w.-]+)", readme))
    assert colab == {f"{slug}/blob/{repo.get('branch', 'main')}"}, f"README.md's Colab URL names {colab}, _config.yml says {repo}"
    assert pip == {slug}, f"README.md's pip URL names {pip}, _config.yml says {slug}"
