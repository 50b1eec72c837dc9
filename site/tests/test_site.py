"""The built website in headless Chromium: every page loads cleanly and offline, links resolve, search finds both languages.

Run by .ci/run after `python tools/site.py` (DP_SITE_DIR: the built site; default build/site). Skips, saying why,
where Playwright or a Chromium is missing.
"""

from __future__ import annotations

import functools
import html.parser
import os
import re
import shutil
import subprocess
import sys
import threading
import urllib.parse
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))  # tools.repository: where the pages must link
SITE = Path(os.environ.get("DP_SITE_DIR", ROOT / "build" / "site")).resolve()
CHROMIUM = os.environ.get("DP_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
# flags for a closed network: without the background ones Chromium keeps calling Google's hosts
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
         "--disable-component-update", "--disable-sync"]


class Quiet(SimpleHTTPRequestHandler):
    def log_message(self, *args):  # the test reports what matters; a line per request would drown it
        pass


@pytest.fixture(scope="module")
def server():
    if not (SITE / "index.html").exists():
        pytest.skip(f"no site at {SITE}: build it with `python tools/site.py`")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(Quiet, directory=str(SITE)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser():
    sync_api = pytest.importorskip("playwright.sync_api", reason="Playwright is not installed (requirements-site.txt)")
    with sync_api.sync_playwright() as p:
        try:  # a Chromium on PATH (Debian's), else Playwright's own if `playwright install chromium` fetched one
            chromium = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=FLAGS)
        except sync_api.Error as exc:
            pytest.skip(f"no Chromium to run (apt install chromium, or set DP_CHROMIUM to its path): {exc}"[:300])
        yield chromium
        chromium.close()


class Anchors(html.parser.HTMLParser):
    """The ids of one HTML file, the hrefs of its links, and whether one switches language."""

    def __init__(self):
        super().__init__()
        self.ids, self.hrefs, self.switch = set(), [], False

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if attrs.get("id"):
            self.ids.add(attrs["id"])
        if tag == "a" and attrs.get("href"):
            self.hrefs.append(attrs["href"])
            self.switch |= "course-lang" in (attrs.get("class") or "").split()


@functools.cache
def parsed(path: Path) -> Anchors:
    found = Anchors()
    found.feed(path.read_text(encoding="utf-8"))
    return found


def html_pages() -> list[Path]:
    return sorted(p.relative_to(SITE) for p in SITE.rglob("*.html") if "_static" not in p.parts)


def broken_links(page: Path) -> list[str]:
    """The page's internal links whose file or anchor does not exist."""
    broken = []
    for href in parsed(SITE / page).hrefs:
        url = urllib.parse.urlsplit(href)
        if url.scheme or url.netloc or href.startswith(("mailto:", "javascript:")):
            continue
        target = (SITE / page).parent / urllib.parse.unquote(url.path) if url.path else SITE / page
        target = target.resolve()
        if target.is_dir():
            target = target / "index.html"
        if not target.exists() or SITE not in target.parents and target != SITE:
            broken.append(href)
        elif url.fragment and target.suffix == ".html" and url.fragment not in parsed(target).ids:
            broken.append(href)
    return broken


def visit(browser, url: str, act=None) -> dict:
    """Open url: console errors, requests that left the local server, images that did not load."""
    page = browser.new_page()
    errors, outside, missing = [], [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    origin = urllib.parse.urlsplit(url).netloc
    page.on("request", lambda r: outside.append(r.url) if urllib.parse.urlsplit(r.url).netloc not in (origin, "")
            and not r.url.startswith("data:") else None)
    page.on("response", lambda r: missing.append(f"{r.status} {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="networkidle")
    broken_images = page.evaluate(
        "() => [...document.images].filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src)")
    result = {"errors": errors, "outside": outside, "missing": missing, "images": broken_images}
    if act:
        result["acted"] = act(page)
    page.close()
    return result


@pytest.mark.parametrize("page", html_pages() if (SITE / "index.html").exists() else [], ids=str)
def test_every_page_loads_offline_without_errors(page, server, browser):
    seen = visit(browser, f"{server}/{page.as_posix()}")
    assert seen == {"errors": [], "outside": [], "missing": [], "images": []}
    assert broken_links(page) == [] and parsed(SITE / page).switch, "no link to the other language"


def search_page(browser, server, root: str, query: str, script: str) -> list[str]:
    """What a script reads off the site's search results for a query, once the search has finished."""
    def read(page):  # Sphinx lists the results one by one and writes the summary's text after the last
        page.wait_for_function("() => document.querySelector('#search-results .search-summary')?.textContent.trim()",
                               timeout=20_000)
        return page.eval_on_selector_all("#search-results ul.search li", script)

    return visit(browser, f"{server}/{root}search.html?q={urllib.parse.quote(query)}", read)["acted"]


def search_results(browser, server, root: str, query: str) -> list[str]:
    """The pages the site's own search lists for a query, best first."""
    return search_page(browser, server, root, query, "lis => lis.map(li => li.querySelector('a').pathname)")


@pytest.mark.parametrize("root, query, first", [
    ("", "no_sync", "05_ddp_communication"), ("zh-CN/", "梯度累积", "05_ddp_communication"),
    ("zh-CN/", "no_sync", "05_ddp_communication"), ("zh-CN/", "梯度累积 no_sync", "05_ddp_communication"),
    ("", "gradient accumulation", "05_ddp_communication"), ("zh-CN/", "环形全归约", "03_ddp_sampler_allreduce"),
    ("zh-CN/", "检查点", "07_real_jobs"), ("", "ZeRO", "08_sharded_data_parallel"),
    ("zh-CN/", "桶", "04_ddp_from_scratch"),  # a word of one character: the notebook that builds buckets
])
def test_search_lists_the_notebook_that_teaches_it_first(root, query, first, server, browser):
    found = search_results(browser, server, root, query)
    assert found and found[0] == f"/{root}notebooks/{first}.html", found


def test_the_chinese_term_is_found_only_because_the_index_is_segmented():
    """In notebook 05's Chinese text 梯度累积 sits inside longer runs of characters: a plain index of words between
    spaces and punctuation holds no such word; the site's index, segmented by jieba, does."""
    import nbformat

    zh = nbformat.read(ROOT / "notebooks" / "05_ddp_communication.zh-CN.ipynb", as_version=4)
    text = "\n".join(c.source for c in zh.cells if c.cell_type == "markdown")
    assert "梯度累积" in text and "梯度累积" not in re.findall(r"\w+", text)
    index = (SITE / "zh-CN" / "searchindex.js").read_text(encoding="utf-8")
    assert '"梯度累积"' in index or '"\\u68af\\u5ea6\\u7d2f\\u79ef"' in index


def test_a_solution_stays_hidden_until_its_toggle_is_clicked(server, browser):
    def toggle(page):
        solution = page.locator("details.solution").first
        code = solution.locator("pre").first
        before = code.is_visible()
        solution.locator("summary").click()
        return before, code.is_visible()

    for root in ("", "zh-CN/"):
        assert visit(browser, f"{server}/{root}notebooks/03_ddp_sampler_allreduce.html", toggle)["acted"] == (False, True)


def test_every_notebook_page_links_colab_kaggle_the_ipynb_and_the_other_language():
    for page in html_pages():
        if len(page.parts) < 2 or page.parts[-2] != "notebooks":
            continue
        hrefs = parsed(SITE / page).hrefs
        name = page.stem + (".zh-CN" if page.parts[0] == "zh-CN" else "") + ".ipynb"
        assert any(h.startswith("https://colab.research.google.com/github/") and h.endswith(name) for h in hrefs)
        assert any(h.startswith("https://kaggle.com/kernels/welcome?src=") and h.endswith(name) for h in hrefs)
        assert any(h.endswith(f"ipynb/{name}") for h in hrefs)
        other = "zh-CN/" if page.parts[0] != "zh-CN" else "../"
        assert any(h.endswith(f"{other}notebooks/{page.stem}.html") for h in hrefs), page


def test_every_page_names_its_licence_build_and_where_to_report_in_the_footer(server):  # server: skips without a site
    from tools import repository

    home, sha = repository.home(), subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=ROOT,
                                                  capture_output=True, text=True).stdout.strip()
    pages = [page for page in html_pages() if page.name not in ("search.html", "genindex.html")]
    assert pages, f"no pages under {SITE}"
    for page in pages:
        text, hrefs = (SITE / page).read_text(encoding="utf-8"), parsed(SITE / page).hrefs
        assert home.file("LICENSE") in hrefs and f"{home.url}/issues" in hrefs, page
        built = re.search(r'class="course-built">(.*?)</span>', text, re.S)
        assert built and re.search(r"\d{4}-\d\d-\d\d", built[1]), page  # the date it was built
        assert not sha or f">{sha}</a>" in built[1], page  # the commit, linked (the build's checkout is this one)
        opens = [h for h in hrefs if h.startswith(("https://colab.research.google.com/", "https://kaggle.com/kernels"))]
        assert all(h.startswith((home.colab(""), home.kaggle(""))) for h in opens), page  # pyproject.toml's, on its branch


def test_math_is_typeset_and_code_has_a_copy_button(server, browser):
    def look(page):
        page.wait_for_selector("mjx-container", timeout=20_000)
        raw = page.eval_on_selector_all(".math", "ms => ms.filter(m => !m.querySelector('mjx-container')).length")
        return page.eval_on_selector_all(".math", "ms => ms.length"), raw, page.eval_on_selector_all(
            "button.copybtn", "b => b.length")

    for root in ("", "zh-CN/"):
        math, untypeset, buttons = visit(browser, f"{server}/{root}notebooks/01_data_splitting.html", look)["acted"]
        assert math > 0 and untypeset == 0 and buttons > 0, (math, untypeset, buttons)


def test_on_a_phone_the_menu_opens_and_nothing_is_wider_than_the_screen(server, browser):
    page = browser.new_page(viewport={"width": 400, "height": 800})
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}notebooks/05_ddp_communication.html", wait_until="networkidle")
        sidebar = "() => document.querySelector('#pst-primary-sidebar').getBoundingClientRect().x"
        assert page.evaluate(sidebar) < 0  # closed
        page.locator(".bd-header-article .primary-toggle").click()
        page.wait_for_timeout(400)
        assert page.evaluate(sidebar) == 0  # slid in
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 400
    page.close()


def test_search_excerpts_hold_no_header_links_or_contents(server, browser):
    found = search_page(browser, server, "zh-CN/", "分片",
                        "lis => lis.map(li => li.querySelector('p.context')).filter(p => p).map(p => p.textContent)")
    assert found and not any("Kaggle" in text or "目录" in text for text in found), found


@pytest.mark.parametrize("width", [1400, 390])
def test_search_and_the_theme_toggle_work_at_every_width(server, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}notebooks/04_ddp_from_scratch.html", wait_until="networkidle")
        page.locator(".bd-header-article .theme-switch-button").click()  # a menu: light, dark, auto
        page.locator(".bd-header-article .theme-change-button[data-mode=dark]").click()
        assert page.evaluate("() => document.documentElement.dataset.theme") == "dark"
        page.locator(".search-button__button:visible").first.click()  # wide: the sidebar's field; narrow: the header's
        field = page.locator("#pst-search-dialog input[name=q]")
        field.wait_for(state="visible", timeout=5_000)
        field.fill("bucket")
        field.press("Enter")
        page.wait_for_url("**/search.html?q=bucket*", timeout=10_000)
    page.close()


def test_the_other_editions_link_is_no_heading_on_the_site():
    for page in html_pages():
        if len(page.parts) >= 2 and page.parts[-2] == "notebooks":
            text = (SITE / page).read_text(encoding="utf-8")
            assert not re.search(r"<h2[^>]*>\s*(中文版|English)", text), page


def test_the_front_page_is_a_course_page_that_fits_a_phone(server, browser):
    page = browser.new_page(viewport={"width": 390, "height": 800})
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}index.html", wait_until="networkidle")
        start = page.locator("a.sd-stretched-link").first  # the "start here" card
        assert start.get_attribute("href").endswith("notebooks/00_ddp_in_one_picture.html")
        assert page.locator(".bd-article a[href$='readme.html']").count() >= 1  # the repository's README, one click on
        height = page.evaluate("() => document.documentElement.scrollHeight")
        assert height < 8000, height  # the README was ~48,500 px tall on a phone
        assert page.locator("meta[name=description]").get_attribute("content")
        assert page.locator("link[rel=alternate][hreflang]").count() == 1
    page.close()


def test_a_long_output_is_capped_until_its_button_is_clicked_and_listings_share_one_stylesheet(server, browser):
    def fold(page):
        output = page.locator(".course-capped").first.element_handle()  # it loses the class when opened
        capped = output.evaluate("o => o.getBoundingClientRect().height")
        page.locator(".course-expand").first.click()
        return capped, output.evaluate("o => o.getBoundingClientRect().height"), page.locator(".course-capped").count()

    for root in ("", "zh-CN/"):
        seen = visit(browser, f"{server}/{root}notebooks/00_ddp_in_one_picture.html", fold)["acted"]
        assert seen[0] <= 36 * 16 + 1 and seen[1] > 2 * seen[0], seen  # the side-by-side diff: ~2,500 px whole
    for page in html_pages():
        assert "pre { line-height: 125%; }" not in (SITE / page).read_text(encoding="utf-8"), page


def loaded(browser, url: str) -> list[tuple[str, int]]:
    """Each file a page loaded from this site, with its size on disk."""
    page, files = browser.new_page(), []
    page.on("requestfinished", lambda r: files.append(urllib.parse.unquote(urllib.parse.urlsplit(r.url).path)))
    page.goto(url, wait_until="networkidle")
    page.close()
    return [(f, (SITE / f.lstrip("/")).stat().st_size if (SITE / f.lstrip("/")).is_file() else 0) for f in files]


def test_a_notebook_page_is_light(server, browser):
    """At most 15 requests; without math at most 1 MB besides its figures (MathJax alone is 1.2 MB); figures said."""
    for page in html_pages():
        if len(page.parts) < 2 or page.parts[-2] != "notebooks":
            continue
        files = loaded(browser, f"{server}/{page.as_posix()}")
        figures = sum(size for name, size in files if "/_images/" in name)
        rest = sum(size for name, size in files if "/_images/" not in name)
        assert len(files) <= 15, (page, [name for name, _ in files])
        if not any("mathjax" in name for name, _ in files):
            assert rest <= 1_000_000, (page, rest, figures)
        print(f"{page}: {len(files)} requests, {rest // 1000} kB + figures {figures // 1000} kB")


def test_the_spans_the_site_leaves_out_of_listings_had_the_listings_own_colour(server, browser):
    """tools/site_assets.py drops <span class="n|p|w"> from listings: true only while they draw in the base colour."""
    def colours(page):
        return page.evaluate("""() => { const pre = document.createElement('div'); pre.className = 'highlight';
            pre.innerHTML = '<pre>x<span class="n">n</span><span class="p">p</span><span class="w">w</span></pre>';
            document.body.append(pre);
            return [...pre.querySelectorAll('pre, span')].map(e => getComputedStyle(e).color); }""")

    for theme in ("light", "dark"):
        def look(page, theme=theme):
            page.evaluate(f"() => document.documentElement.dataset.theme = '{theme}'")
            return colours(page)
        seen = visit(browser, f"{server}/notebooks/04_ddp_from_scratch.html", look)["acted"]
        assert len(set(seen)) == 1, (theme, seen)


@pytest.mark.parametrize("root, query, words", [("", "桶", "The Chinese edition finds"),
                                                ("zh-CN/", "no_sync", "英文版找到")])
def test_the_search_page_says_what_the_other_edition_finds(server, browser, root, query, words):
    def note(page):
        page.wait_for_selector(".course-elsewhere", timeout=30_000)
        return page.locator(".course-elsewhere").text_content(), page.locator(".course-elsewhere a").get_attribute("href")

    text, href = visit(browser, f"{server}/{root}search.html?q={urllib.parse.quote(query)}", note)["acted"]
    other = search_results(browser, server, "" if root else "zh-CN/", query)
    assert text.startswith(words) and int(re.search(r"\d+", text)[0]) == len(other) >= 1, (text, len(other))
    assert href.endswith(f"search.html?q={urllib.parse.quote(query)}")


def test_a_hyphenated_term_is_highlighted_whole(server, browser):
    def marks(page):
        page.wait_for_selector("#search-results ul.search li span.highlighted", timeout=20_000)
        here = page.eval_on_selector_all("#search-results span.highlighted", "s => s.map(x => x.textContent.toLowerCase())")
        page.locator("#search-results ul.search li a").first.click()
        page.wait_for_selector("span.highlighted", state="attached", timeout=10_000)
        return here, page.eval_on_selector_all("span.highlighted", "s => s.map(x => x.textContent.toLowerCase())")

    on_search, on_page = visit(browser, f"{server}/search.html?q=all-reduce", marks)["acted"]
    assert on_search and set(on_search) == {"all-reduce"}, on_search
    assert on_page and set(on_page) == {"all-reduce"}, on_page


def test_a_result_opens_the_section_that_holds_the_term(server, browser):
    def first(page):
        page.wait_for_selector("#search-results ul.search li .course-section", timeout=20_000)
        item = page.locator("#search-results ul.search li").filter(has=page.locator(".course-section")).first
        return item.locator("a").first.get_attribute("href"), item.locator(".course-section").text_content()

    for root in ("", "zh-CN/"):
        href, name = visit(browser, f"{server}/{root}search.html?q=no_sync", first)["acted"]
        assert "#" in href and name.startswith(" › "), (href, name)
        url = urllib.parse.urlsplit(urllib.parse.urljoin(f"{server}/{root}search.html", href))
        assert url.fragment in parsed(SITE / url.path.lstrip("/")).ids


SVG_TEXT = re.compile(r"<!-- (.*?) -->", re.S)  # matplotlib's comment before each text it draws as outlines


def figures_of(page: Path) -> list[tuple[str, Path]]:
    """Each figure on a built page: its alt and its SVG file."""
    text = (SITE / page).read_text(encoding="utf-8")
    return [(html.unescape(alt), ((SITE / page).parent / src).resolve())
            for alt, src in re.findall(r'<img alt="([^"]*)" class="course-figure" src="([^"]+)"', text)]


def test_every_figure_is_vector_says_what_it_shows_and_the_chinese_ones_are_chinese():
    seen = 0
    for page in (p for p in html_pages() if p.parts[-2:-1] == ("notebooks",)):
        chinese = page.parts[0] == "zh-CN"
        for alt, svg in figures_of(page):
            seen += 1
            assert svg.suffix == ".svg" and svg.is_file(), (page, svg)
            assert alt.startswith("图：" if chinese else "Figure: ") and len(alt) > 12, (page, alt)
            drawn = SVG_TEXT.findall(svg.read_text(encoding="utf-8"))
            assert not chinese or any(re.search(r"[\u4e00-\u9fff]", t) for t in drawn), (page, svg.name, drawn[:5])
    assert seen >= 2 * 20, seen  # both editions' figures, about two dozen each


@pytest.mark.parametrize("width", [1400, 390])
def test_a_figure_fits_the_page_and_opens_at_its_own_size(server, browser, width):
    page = browser.new_page(viewport={"width": width, "height": 900})
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}notebooks/09_scaling_and_benchmarks.html", wait_until="networkidle")
        link = page.locator("a.figure-open").first  # the widest figure: three panels, 16 inches
        assert (SITE / root / "notebooks" / link.get_attribute("href")).resolve().is_file()  # the SVG alone, without scripts
        link.scroll_into_view_if_needed()
        box = link.locator("img").bounding_box()
        assert 0 < box["width"] <= width and page.evaluate("() => document.documentElement.scrollWidth") <= width
        link.click()
        big = page.locator(".course-viewer img")
        big.wait_for(state="visible", timeout=5_000)
        natural = big.evaluate("i => i.naturalWidth")
        assert big.bounding_box()["width"] == pytest.approx(natural, abs=1) and natural > 1000  # 10 pt text, as drawn
        assert page.locator(".course-viewer").evaluate("v => v.scrollWidth") >= min(natural, width)  # pans across
        page.keyboard.press("Escape")
        assert page.locator(".course-viewer").count() == 0
    page.close()


def test_no_notebook_page_is_wider_than_a_phone(server, browser):
    page = browser.new_page(viewport={"width": 390, "height": 800})
    for name in (p for p in html_pages() if p.parts[-2:-1] == ("notebooks",)):
        page.goto(f"{server}/{name.as_posix()}", wait_until="load")
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390, name  # 04's long heading did
    page.close()


DIFF_ROWS = """() => [...document.querySelectorAll('table.course-diff tr')].map(row => ({
    kind: row.className, cells: [...row.cells].map(cell => {
        const box = cell.getBoundingClientRect();
        return {shown: getComputedStyle(cell).display !== 'none', left: Math.round(box.left), top: box.top,
                right: box.right}; })}))"""


def test_on_a_phone_notebook_00s_diff_reads_as_one_column(server, browser):
    """Under 600 px the side-by-side diff is one column: a changed row's old line above its new one at the
    same left edge, a shared line once, nothing past the screen's edge."""
    page = browser.new_page(viewport={"width": 390, "height": 800})
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}notebooks/00_ddp_in_one_picture.html", wait_until="networkidle")
        rows = page.evaluate(DIFF_ROWS)
        assert rows and any(r["kind"] == "changed" for r in rows) and any(r["kind"] == "same" for r in rows)
        for row in rows:
            old, new = row["cells"]
            assert new["shown"] and new["right"] <= 390 + 1, (root, row)
            assert old["shown"] == (row["kind"] != "same"), (root, row)  # a shared line once
            if old["shown"]:
                assert old["left"] == new["left"] and old["top"] < new["top"], (root, row)
    page.close()


TABLE_CELLS = """() => [...document.querySelectorAll('.bd-article table')].map(table => {
    const names = [...table.querySelectorAll('thead th')].map(th => th.textContent.trim());
    const cells = [...table.querySelectorAll('tbody tr')].flatMap(row => [...row.cells].map(
        (td, i) => [names[i], getComputedStyle(td, '::before').content, td.textContent.trim()]));
    return {header: getComputedStyle(table.querySelector('thead')).display, cells}; })"""


def test_on_a_phone_a_stacked_table_cell_names_its_column(server, browser):
    """Under 600 px a table's rows stack and its header is hidden: each cell shows its column's
    name before it (the front page's route: '42 min' alone says nothing)."""
    page = browser.new_page(viewport={"width": 390, "height": 800})
    for root, colon in (("", ": "), ("zh-CN/", "：")):
        page.goto(f"{server}/{root}index.html", wait_until="networkidle")
        seen = page.evaluate(TABLE_CELLS)
        assert seen and all(table["header"] == "none" for table in seen), seen
        cells = [cell for table in seen for cell in table["cells"] if cell[0]]
        assert cells and all(shown == f'"{name}{colon}"' for name, shown, _ in cells), cells[:6]
        times = [text for name, _, text in cells if re.fullmatch(r"\d+ (min|分钟)", text)]
        assert len(times) >= 10, cells  # the route's minutes, each now under its column's name
    page.close()


LINES = """pres => pres.filter(p => p.clientHeight > 0).map(pre => {
    const style = e => getComputedStyle(e);
    const pad = e => parseFloat(style(e).paddingTop) + parseFloat(style(e).paddingBottom);
    const probe = pre.cloneNode(); probe.textContent = 'x'; pre.after(probe);
    const line = probe.clientHeight - pad(probe); probe.remove();
    const lines = pre.textContent.replace(/\\n$/, '').split('\\n').length;
    const shown = Math.round((pre.clientHeight - pad(pre)) / line);
    return [pre.textContent, lines, shown, pre.scrollWidth > pre.clientWidth]; })"""
VERDICTS = """spans => spans.map(s => [s.textContent, s.getClientRects().length,
                                s.closest('pre').scrollWidth <= s.closest('pre').clientWidth])"""


def test_on_a_phone_an_output_keeps_its_lines_and_a_verdict_wraps(server, browser):
    """Notebook 03's printed ring table keeps one row a line and scrolls sideways, as listings
    do; a checker's one-line verdict ('not yet: ...', '还不对：...') is a sentence, and wraps."""
    page = browser.new_page(viewport={"width": 390, "height": 800})
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}notebooks/03_ddp_sampler_allreduce.html",
                  wait_until="networkidle")
        # each output: [text, its lines, the lines it takes on screen, whether it scrolls]
        outputs = page.eval_on_selector_all(".cell_output pre:not(:has(.course-verdict))", LINES)
        ring = [o for o in outputs if re.search(r"torch\.float32  (error|误差) ", o[0])]
        assert ring and ring[0][3] and ring[0][1] == ring[0][2] > 5, ring  # a row a line, scrolled
        assert all(o[1] == o[2] for o in outputs), [o for o in outputs if o[1] != o[2]][:3]
        verdicts = page.eval_on_selector_all(".cell_output .course-verdict", VERDICTS)
        assert verdicts and all(re.match(r"not yet: |还不对：", v[0]) for v in verdicts), verdicts
        assert any(v[1] > 1 for v in verdicts) and all(v[2] for v in verdicts), verdicts
        assert page.evaluate("() => document.documentElement.scrollWidth") <= 390
    page.close()


@pytest.mark.parametrize("close", ["back", "Escape", "button", "backdrop"])
def test_the_figure_viewer_closes_with_back_and_leaves_no_history_entry(server, browser, close):
    """On a phone Back closes an open figure instead of leaving the page; closing it otherwise
    takes back the history entry opening added, so that Back then leaves the page."""
    page = browser.new_page(viewport={"width": 390, "height": 800})
    viewer = page.locator(".course-viewer")
    for root in ("", "zh-CN/"):
        page.goto(f"{server}/{root}index.html", wait_until="networkidle")
        page.goto(f"{server}/{root}notebooks/09_scaling_and_benchmarks.html",
                  wait_until="networkidle")
        figure_page, entries = page.url, page.evaluate("() => history.length")
        page.locator("a.figure-open").first.click()
        viewer.wait_for(state="visible", timeout=5_000)
        assert page.evaluate("() => history.length") == entries + 1
        if close == "back":
            page.evaluate("() => history.back()")
        elif close == "Escape":
            page.keyboard.press("Escape")
        elif close == "button":
            viewer.locator("button").click()
        else:
            page.mouse.click(10, 10)  # the backdrop above the figure (the button is at the right)
        viewer.wait_for(state="detached", timeout=5_000)
        page.wait_for_timeout(300)  # a history.back() lands after the viewer is gone
        assert page.url == figure_page
        assert page.evaluate("() => history.state?.courseViewer") is None
        page.evaluate("() => history.back()")  # no entry of the viewer's is left: Back leaves
        page.wait_for_url(f"{server}/{root}index.html", timeout=5_000)
    page.close()


def test_the_start_card_gives_notebook_00s_times_from_the_route_table(server, browser):
    def look(page):
        card = page.locator(".sd-card").first.text_content()
        row = page.locator(".bd-article table tbody tr").first
        return card, [row.locator("td").nth(i).text_content().strip() for i in range(5)]

    for root in ("", "zh-CN/"):
        card, row = visit(browser, f"{server}/{root}index.html", look)["acted"]
        assert row[0] == "00" and row[3] in card and row[4] in card, (card, row)
        assert not re.search(r"30 (minutes|分钟)", card), card


def beyond_setup(word: str) -> list[str]:
    """The lessons that hold a word outside their first code cell (the setup every one opens with)."""
    import json

    names = []
    for path in sorted((ROOT / "notebooks").glob("[0-9][0-9]_*[a-z].ipynb")):
        cells = json.loads(path.read_text(encoding="utf-8"))["cells"]
        first = next(i for i, c in enumerate(cells) if c["cell_type"] == "code")
        if any(word in "".join(c["source"]) for i, c in enumerate(cells) if i != first):
            names.append(path.stem)
    return names


def test_search_leaves_out_the_setup_cell_every_notebook_opens_with(server, browser):
    """Every notebook's first code cell is the same clone and imports: search neither lists a page
    for its words (importlib: only the pages that use it elsewhere) nor shows it as a result's excerpt."""
    setup = {"": "fetch the course", "zh-CN/": "获取课程代码"}
    excerpts = "lis => lis.map(li => li.querySelector('p.context')?.textContent || '')"
    for root, words in setup.items():
        found = search_results(browser, server, root, "importlib")
        assert sorted(found) == [f"/{root}notebooks/{name}.html" for name in beyond_setup("importlib")], found
        shown = search_page(browser, server, root, "dp_helpers", excerpts)
        assert shown and not any(words in text or "importlib" in text for text in shown), shown


def test_every_notebook_page_folds_its_setup_cell_under_a_line_in_its_language(server, browser):
    summaries = {"": "Setup for Colab / Kaggle, and the imports",
                 "zh-CN/": "Colab / Kaggle 的准备代码和导入"}
    for name in (p for p in html_pages() if p.parts[-2:-1] == ("notebooks",)):
        text = (SITE / name).read_text(encoding="utf-8")
        first = text.index('<div class="cell ')  # the first code cell: folded, closed
        assert text.startswith('<div class="cell tag_hide-cell tag_course-setup', first), name
        assert re.match(r'[^>]*>\s*<details class="[^"]*hide[^"]*">', text[first:]), name

    def fold(page):
        setup = page.locator(".bd-article .cell").first
        code = setup.locator("pre").first
        before = (setup.locator("summary").inner_text().strip(), code.is_visible())
        setup.locator("summary").click()
        return before, code.is_visible()

    page = browser.new_page(viewport={"width": 390, "height": 800})
    for root, summary in summaries.items():
        page.goto(f"{server}/{root}notebooks/03_ddp_sampler_allreduce.html",
                  wait_until="networkidle")
        assert fold(page) == ((summary, False), True)
    page.close()


LOOK = """link => [document.body, document.querySelector(link)].map(getComputedStyle).map(
    (s, i) => i ? s.color : [s.fontFamily, s.color, s.backgroundColor].join(' / '))"""


def test_a_missing_address_gets_a_404_page_in_both_languages_styled_like_the_site(server, browser):
    """GitHub Pages answers an address with no page with the site's 404.html, in whatever folder it
    was asked: its links still reach both front pages (a project site lives under /NAME/), and it
    looks like the site, in light and in dark."""
    assert (SITE / "404.html").is_file()
    page = browser.new_page(viewport={"width": 390, "height": 800})
    body = (SITE / "404.html").read_text(encoding="utf-8")

    def answer(route):
        route.fulfill(status=404, body=body, content_type="text/html")

    links = "() => [...document.querySelectorAll('a[data-path]')].map(a => a.href)"
    page.route("**/missing/**", answer)
    page.goto(f"{server}/missing/zh-CN/notebooks/99_gone.html", wait_until="load")
    assert page.evaluate(links) == [f"{server}/missing/index.html",
                                    f"{server}/missing/zh-CN/index.html"]
    for where in ("notebooks/99_gone.html", "zh-CN/docs/gone.html", "gone.html"):
        page.route(f"**/{where}", answer)
        page.goto(f"{server}/{where}", wait_until="load")
        assert page.evaluate(links) == [f"{server}/index.html", f"{server}/zh-CN/index.html"], where
        assert page.locator("section[lang=en] h1").inner_text() == "Page not found"
        assert page.locator("section[lang=zh-CN] h1").inner_text() == "页面不存在"
    for scheme in ("light", "dark"):  # the site follows the system's (its theme's mode is "auto")
        page.emulate_media(color_scheme=scheme)
        page.goto(f"{server}/gone.html", wait_until="load")
        styled = page.evaluate(LOOK, "a[data-path]")
        page.locator("a.course-lang").click()
        page.wait_for_url(f"{server}/zh-CN/index.html")
        assert page.evaluate(LOOK, ".bd-article li a[href$='readme.html']") == styled, scheme
    page.close()


def test_the_themes_unrendered_templates_are_not_shipped(server):  # server: skips without a site
    templates = [p.relative_to(SITE) for p in SITE.rglob("_static/**/*.html")]
    assert templates == [], templates  # webpack-macros.html: Jinja, {{ }} links to nowhere
