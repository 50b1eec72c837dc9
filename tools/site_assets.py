"""What a built page loads, made light for a phone (tools/site.py runs it after each Sphinx build).

The pinned theme makes a notebook page load ~30 files, 3 MB: Font Awesome's script with every icon there is (1.5 MB),
eight stylesheets, eleven scripts, and the search index on every page although search-as-you-type is off. Here the
few icons the pages use become inline SVG, the stylesheets one file, the scripts two (in their order, the deferred
ones apart), and the search scripts stay on the search page. Nothing else changes: tests open every page in a browser.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ICON = re.compile(r'<(i|span) class="([^"]*\bfa-[^"]*)"([^>]*)></\1>')
FA_SCRIPT = re.compile(r'<script defer(?:="defer")? src="[^"]*_static/scripts/fontawesome\.js[^"]*"></script>\s*')
PACKS = {"fa-solid": "fas", "fas": "fas", "fa-brands": "fab", "fab": "fab", "fa-regular": "far", "far": "far"}
NOT_NAMES = {"fa-lg", "fa-fw", *PACKS}
STYLESHEET = re.compile(r'<link (?:href="([^"]+)" rel="stylesheet"|rel="stylesheet" type="text/css" href="([^"]+)") />\n?')
SCRIPT = re.compile(r'<script( defer)?( data-[\w-]+="[^"]*")? src="([^"]+)"></script>\n?')
PRELOAD = re.compile(r'<link rel="preload" as="script" href="[^"]+" />\n?')
SEARCH = ("searchtools.js", "language_data.js")  # under _static/, with searchindex.js: the search page's own
GLYPHS = re.compile(r'(?:\.fa-[\w-]+,?)+\{--fa:"[^"]*"(?:;--fa--fa:"[^"]*")?\}')  # icon -> font glyph: SVG now
# highlighted names, punctuation and spaces are drawn in the listing's own colour in both of the theme's styles (a
# browser test checks it), so their 10,000 spans on a long page (~140 kB) go and their text stays
PLAIN = re.compile(r'<span class="[npw]">([^<]*)</span>')
FIGURE = re.compile(r'<img alt="[^"]*" class="course-figure" src="([^"]+)" />')  # tools/site.py's figure outputs
OPEN = {"en": "Open the figure at its own size", "zh-CN": "以原始大小查看这张图"}  # course.js opens it over the page
# a notebook output's text; in it, a checker's one-line verdict (dp_helpers/course/checkers/
# exercises.py, either language): a sentence, which wraps on a phone, where the output's other lines
# keep their shape and scroll sideways
OUTPUT = re.compile(r'(<div class="output [^"]*"><div class="highlight"><pre>)(.*?)(?=</pre>)',
                    re.S)
VERDICT = re.compile(r"^((?:<span></span>)?)((?:correct|not yet): .*|(?:正确|还不对)：.*)$", re.M)
URL = re.compile(r'url\((["\']?)(?!data:|https?:|/)([^"\')]+)\1\)')


def icon_paths(script: Path) -> dict[tuple[str, str], tuple[str, str, str]]:
    """The theme's Font Awesome icons: (pack, name) -> (width, height, SVG path), read from its script's packs."""
    text = script.read_text(encoding="utf-8")
    packs = [(m.start(), m[1]) for m in re.finditer(r'"(fa[a-z]{1,2})"\s*,\s*[A-Za-z_$][\w$]*\)', text)]
    found = {}
    for m in re.finditer(r'(?:"([\w-]+)"|(?<![\w$-])([a-z]\w*)):\[(\d+),(\d+),\[[^\]]*\],"\w+","([^"]+)"\]', text):
        pack = next((name for at, name in packs if at > m.start()), None)  # a pack's icons come before its name
        found.setdefault((pack, m[1] or m[2]), (m[3], m[4], m[5]))
    return found


def svg_icons(paths: dict, script: Path):
    """The function that turns one icon element into inline SVG, keeping its classes and attributes."""
    def svg(m: re.Match) -> str:
        classes = m[2].split()
        pack = next((PACKS[c] for c in classes if c in PACKS), "fas")
        name = next(c[3:] for c in classes if c.startswith("fa-") and c not in NOT_NAMES)
        if (pack, name) not in paths:
            raise SystemExit(f"the theme uses the icon {pack} {name}, which {script} does not define")
        width, height, d = paths[pack, name]
        kept = " ".join(c for c in classes if c not in PACKS)  # a pack class would draw it again, from a web font
        return (f'<svg class="svg-inline--fa {kept}"{m[3]} aria-hidden="true" viewBox="0 0 {width} {height}">'
                f'<path fill="currentColor" d="{d}"/></svg>')

    return svg


def bundle_css(static: Path, hrefs: list[str], name: str = "site.css") -> str:
    """The stylesheets, in order, in one file under _static/ (their relative url()s and @imports resolved)."""
    parts = [GLYPHS.sub("", inline_css(static, href)) for href in hrefs]
    (static / name).write_text("\n".join(parts), encoding="utf-8")
    return name


def inline_css(static: Path, href: str) -> str:
    """One stylesheet's text, its @imports inlined and its url()s made relative to _static/."""
    path = static / href
    text = path.read_text(encoding="utf-8")
    text = re.sub(r'@import "([^"]+)";', lambda m: inline_css(static, relpath(path.parent / m[1], static)), text)
    return URL.sub(lambda m: f"url({m[1]}{relpath(path.parent / m[2], static)}{m[1]})", text)


def relpath(path: Path, start: Path) -> str:
    """path relative to start, with / separators and .. resolved."""
    return Path(os.path.relpath(os.path.normpath(path), start)).as_posix()


def bundle_js(static: Path, srcs: list[str], name: str) -> str:
    """The scripts, in order, in one file under _static/."""
    text = "\n;\n".join((static / src).read_text(encoding="utf-8") for src in srcs)
    (static / name).write_text(text, encoding="utf-8")
    return name


def to_static(href: str, page: Path, site: Path) -> str | None:
    """A page's reference to a file under the site's _static/, as a path inside _static/ (None for anything else)."""
    target = (page.parent / href.split("?")[0]).resolve()
    try:
        return target.relative_to((site / "_static").resolve()).as_posix()
    except ValueError:
        return None


class Bundles:
    """The site's bundles, made from the first page and required of every other page (the same files, in order)."""

    def __init__(self, site: Path):
        self.site, self.static, self.made = site, site / "_static", {}

    def href(self, kind: str, files: list[str], page: Path) -> str:
        """The bundle of `files` as the page links it; builds it the first time, refuses a page with other files."""
        if kind not in self.made:
            make = bundle_css if kind == "css" else lambda s, f: bundle_js(s, f, f"site-{kind}.js")
            self.made[kind] = (files, make(self.static, files))
        if self.made[kind][0] != files:
            raise SystemExit(f"{page} loads other {kind} files than the site's first page: {files}")
        return relpath(self.static / self.made[kind][1], page.parent)


def lighten_page(text: str, page: Path, bundles: Bundles) -> str:
    """One page's stylesheets and scripts replaced by the bundles; the search scripts kept on the search page only."""
    site, search_page = bundles.site, page.name == "search.html" and page.parent == bundles.site
    sheets = list(STYLESHEET.finditer(text))
    css = [to_static(m[1] or m[2], page, site) for m in sheets]
    if sheets and None not in css:
        first = sheets[0]
        link = f'<link rel="stylesheet" href="{bundles.href("css", css, page)}" />\n'
        text = STYLESHEET.sub(lambda m: link if m.start() == first.start() else "", text)
    for deferred in (False, True):  # positions are read again after each change
        scripts = [(m, to_static(m[3], page, site)) for m in SCRIPT.finditer(text)]
        group = [(m, src) for m, src in scripts if bool(m[1]) == deferred and src and src not in SEARCH]
        if group:
            href = bundles.href("deferred" if deferred else "js", [src for _, src in group], page)
            attributes = "".join(m[2] for m, _ in group if m[2])  # design-tabs reads its data- attribute off its tag
            tags = {m.start() for m, _ in group}
            tag = f'<script{" defer" if deferred else ""}{attributes} src="{href}"></script>\n'
            text = SCRIPT.sub(lambda m, g=group, t=tag, s=tags: (t if m.start() == g[0][0].start() else "")
                              if m.start() in s else m[0], text)
    if not search_page:
        text = SCRIPT.sub(lambda m: "" if m[3].endswith(("searchtools.js", "language_data.js", "searchindex.js"))
                          else m[0], text)
    return PRELOAD.sub("", text)


def link_figures(text: str) -> str:
    """Each figure a link to its SVG: course.js opens it at its own size over the page (a page's image is only as
    wide as the page); without scripts, or in a new tab, the SVG alone."""
    lang = "zh-CN" if '<html lang="zh-CN"' in text else "en"
    return FIGURE.sub(lambda m: f'<a class="figure-open" href="{m[1]}" title="{OPEN[lang]}">{m[0]}</a>', text)


def mark_verdicts(text: str) -> str:
    """Each checker's verdict in an output in a span of its own: course.css wraps it, only it."""
    verdict = r'\1<span class="course-verdict">\2</span>'
    return OUTPUT.sub(lambda m: m[1] + VERDICT.sub(verdict, m[2]), text)


def lighten(site: Path, skip: tuple[str, ...] = ()) -> None:
    """Every page of one built site (pages under the folders in `skip` belong to another site): icons, bundles."""
    script = site / "_static" / "scripts" / "fontawesome.js"
    svg, bundles = svg_icons(icon_paths(script), script), Bundles(site)
    notice = " ".join(line.strip(" *") for line in script.with_name("fontawesome.js.LICENSE.txt").read_text().splitlines()[1:3])
    for page in sorted(site.rglob("*.html")):
        if page.relative_to(site).parts[0] in (*skip, "_static"):  # _static/: the theme's templates, no pages
            continue
        text = FA_SCRIPT.sub(f"<!-- icons drawn inline: {notice} -->\n", page.read_text(encoding="utf-8"), count=1)
        text = lighten_page(PLAIN.sub(r"\1", ICON.sub(svg, text)), page, bundles)
        page.write_text(mark_verdicts(link_figures(text)), encoding="utf-8")
    script.unlink()
    for template in (site / "_static").glob("*.html"):  # the theme's Jinja macros, unrendered
        template.unlink()
