"""Build the course website from the committed notebooks: `python tools/site.py [--out build/site]`.

Nothing is executed: the pages show the outputs the notebooks were committed with. Each language is one Sphinx
build (myst-nb, the book theme) of a staged copy of its sources: the README as the landing page, the notebooks in
the route's order (notebook 00's route table gives the sidebar's titles and times), the glossary and the source
article; each notebook page ends with its exercises' solutions, collapsed, and opens with its setup
cell folded. English lands in OUT/, Chinese in OUT/zh-CN/; OUT/404.html, in both, answers an address
with no page. Everything a page loads is in OUT (MathJax is copied from the sphinx-mathjax-offline
package), so the site works offline. Needs requirements-site.txt.
"""

from __future__ import annotations

import argparse
import functools
import html
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
from pathlib import Path

import nbformat

try:
    from tools import figure_text, repository, site_assets
except ImportError:  # run as a script: tools/ is on sys.path, not the repository
    import figure_text
    import repository
    import site_assets

ROOT = Path(__file__).resolve().parent.parent
SITE = ROOT / "site"
LANGS = {
    "en": {"suffix": "", "root": "", "readme": "README.md", "name": "English", "code": "en",
           "title": "Data parallelism in PyTorch",
           "description": "Data parallelism in PyTorch, taught by running it: DataParallel, DDP, FSDP2 and fault "
                          "tolerance, each step checked against one process; runs on a CPU, Colab and Kaggle.",
           "solutions": "Solutions", "solution": "Solution to exercise {n}", "colab": "Open in Colab",
           "kaggle": "Open in Kaggle", "download": "Download .ipynb", "route": "The route", "readme_title": "The repository's README",
           "licence": "Code, text and figures under the MIT licence", "built": "Built {date} from commit {commit}",
           "changes": " with local changes", "report": "Report a problem",
           "setup": "Setup for Colab / Kaggle, and the imports", "setup_hide": "Hide the setup"},
    "zh-CN": {"suffix": ".zh-CN", "root": "zh-CN/", "readme": "README.zh-CN.md", "name": "简体中文", "code": "zh-CN",
              "title": "PyTorch 数据并行",
              "description": "PyTorch 数据并行，边运行边学：DataParallel、DDP、FSDP2 与容错训练，每一步都与单进程对照检查；"
                             "CPU、Colab 和 Kaggle 上都能运行。",
              "solutions": "参考答案", "solution": "练习 {n} 的参考答案", "colab": "在 Colab 中打开",
              "kaggle": "在 Kaggle 中打开", "download": "下载 .ipynb", "route": "学习路线", "readme_title": "仓库的 README",
              "licence": "代码、文字和图均采用 MIT 许可证", "built": "{date} 构建自提交 {commit}",
              "changes": "（含未提交的改动）", "report": "报告问题",
              "setup": "Colab / Kaggle 的准备代码和导入", "setup_hide": "收起准备代码"},
}
DOCS = ("glossary", "source-article")
LINK = re.compile(r"(!?)\[([^\]]*)\]\(([^)\s]+)\)")
BADGE = re.compile(r"\[!\[([^\]]*)\]\([^)]*\)\]\(([^)]*)\)")
CODE = re.compile(r"`([^`]*)`")
HAN = re.compile(r"[\u4e00-\u9fff]{2,}")
# IPython's Code display: a copy of the highlighting stylesheet before each listing (light colours, even in dark mode)
LISTING_STYLE = re.compile(r"<style>pre \{ line-height: 125%; \}.*?</style>(?=<div class=\"highlight\">)", re.S)
CROSS_LINK = re.compile(r"## (中文版|English)\n")  # a notebook's link to its other edition, for readers outside the site


def english_notebooks() -> list[Path]:
    """The lessons, in the route's order."""
    return sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if not p.name.endswith(".zh-CN.ipynb"))


def source_of(lang: str, english: Path) -> Path:
    """The file a language's page is built from: the English file or its .zh-CN edition."""
    suffix = LANGS[lang]["suffix"]
    candidate = english.with_name(english.stem + suffix + english.suffix)
    return candidate if candidate.exists() else english


@functools.cache  # asked once per markdown cell
def pages(lang: str) -> dict[Path, tuple[str, str]]:
    """Repository file -> (the language whose site has its page, that page); a file both editions share is this
    language's."""
    mapping = {}
    for lang_ in sorted(LANGS, key=lambda k: k == lang):  # this language last: it keeps the files both share
        mapping[ROOT / LANGS[lang_]["readme"]] = (lang_, "readme.md")
        for nb in english_notebooks():
            mapping[source_of(lang_, nb)] = (lang_, f"notebooks/{nb.name}")
        for doc in DOCS:
            mapping[source_of(lang_, ROOT / "docs" / f"{doc}.md")] = (lang_, f"docs/{doc}.md")
    return mapping


def html_of(lang: str, page: str) -> str:
    """Where a staged page lands in the built site, from the site's root."""
    return LANGS[lang]["root"] + str(Path(page).with_suffix(".html"))


@functools.cache  # asked by the sidebar, the front page's table and its total
def route_markdown(lang: str) -> str:
    """Notebook 00's route table in one language, as the notebook writes it (with the paragraphs around it)."""
    nb0 = nbformat.read(source_of(lang, english_notebooks()[0]), as_version=4)
    return next(c.source for c in nb0.cells if c.cell_type == "markdown" and "| 00 |" in c.source)


def route_rows(lang: str) -> dict[str, list[str]]:
    """Notebook 00's route table in one language: the cells of each notebook's row, by its number."""
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in route_markdown(lang).splitlines()]
    return {r[0]: r for r in rows if len(r) >= 4 and re.fullmatch(r"\d\d", r[0])}


def route(lang: str) -> list[tuple[str, str]]:
    """(page, sidebar title) per notebook: its own title, then its time (or 'optional') from notebook 00's route."""
    times = {}
    for number, cells in route_rows(lang).items():
        # a notebook on the core route shows its time there, one off it the time for all of it and "optional"
        times[number] = cells[3] if re.search(r"\d", cells[3]) else f"{cells[4]}{'，' if lang == 'zh-CN' else ', '}{cells[3]}"
    return [(f"notebooks/{nb.stem}", f"{title(source_of(lang, nb))} · {times[nb.name[:2]]}")
            for nb in english_notebooks()]


def title(notebook: Path) -> str:
    """A notebook's first heading, as its page shows it ('03 · DDP from the inside'), markdown code marks dropped."""
    first = nbformat.read(notebook, as_version=4).cells[0].source.splitlines()[0]
    return first.lstrip("# ").replace("`", "")


def relative(target: str, page: str) -> str:
    """The relative link from page `page` to file `target`, both given from the same root."""
    return os.path.relpath(target, os.path.dirname(page) or ".")


def rewrite_links(text: str, source: Path, page: str, lang: str) -> str:
    """Links between the course's files made into links between its pages; other repository files go to GitHub."""
    mapping = pages(lang)

    def one(m: re.Match) -> str:
        bang, label, target = m.groups()
        if bang or re.match(r"[a-z]+:|#", target):  # images (the lessons' figures are outputs) and URLs stay
            return m.group(0)
        path, _, anchor = target.partition("#")
        file, anchor = (source.parent / path).resolve(), f"#{anchor}" if anchor else ""
        if file in mapping and mapping[file][0] == lang:
            return f"[{label}]({relative(mapping[file][1], page)}{anchor})"
        if file in mapping:  # the other language's page: a plain link into the other site, which Sphinx leaves be
            href, text = relative(html_of(*mapping[file]), html_of(lang, page)), CODE.sub(r"<code>\1</code>", label)
            return f'<a href="{href}{anchor}">{text}</a>'
        try:
            repo_path = file.relative_to(ROOT).as_posix()
        except ValueError:
            return m.group(0)
        return f"[{label}]({repository.home().file(repo_path, folder=file.is_dir())}{anchor})"

    return LINK.sub(one, BADGE.sub("", text)).replace("\n\n \n", "\n\n")  # the badges: each page's header has them


def solutions_cell(nb: Path, lang: str) -> nbformat.NotebookNode | None:
    """A last markdown cell with the notebook's solutions, each in a dropdown that stays closed until clicked."""
    files = sorted((ROOT / "solutions").glob(f"{nb.name[:2]}_*.py"))
    if not files:
        return None
    words = LANGS[lang]
    parts = [f"## {words['solutions']}\n"]
    for f in files:
        n = f.stem.split("_")[1]
        parts.append(f":::{{dropdown}} {words['solution'].format(n=n)}\n:class-container: solution\n\n"
                     f"```python\n{f.read_text(encoding='utf-8').rstrip()}\n```\n:::\n")
    return nbformat.v4.new_markdown_cell("\n".join(parts))


def fold_setup(nb: nbformat.NotebookNode, lang: str) -> None:
    """The setup cell (the first code cell: it clones the course on Colab, Kaggle) folded under a
    line in the page's language, left out of search: every notebook has it; the lesson first."""
    first = next((c for c in nb.cells if c.cell_type == "code"), None)
    if first is None or not repository.CLONE.search(first.source):
        return
    tags = first.metadata.get("tags", [])
    first.metadata["tags"] = [*tags, "hide-cell", "course-setup"]  # course-setup: conf.py, search
    words = LANGS[lang]
    first.metadata.setdefault("mystnb", {}).update(
        {"code_prompt_show": words["setup"], "code_prompt_hide": words["setup_hide"]})


def stage_notebook(english: Path, lang: str, out: Path) -> None:
    """One notebook page: its links rewritten, its solutions appended; the .ipynb itself kept for download."""
    source, page = source_of(lang, english), f"notebooks/{english.name}"
    nb = nbformat.read(source, as_version=4)
    nb.cells = [c for c in nb.cells if not CROSS_LINK.match(c.source)]  # the header links the other language
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            cell.source = rewrite_links(cell.source, source, page, lang)
        for output in cell.get("outputs", []):
            html = output.get("data", {}).get("text/html")
            if html and LISTING_STYLE.match(html):  # show()'s listing: the site's own highlighting styles it
                output["data"]["text/html"] = LISTING_STYLE.sub("", html, count=1)
            svg = output.get("data", {}).get("image/svg+xml")
            if svg:  # myst-nb's alt is the file's path: say what the figure shows instead, in the page's language
                cell.metadata["mystnb"] = {"image": {"alt": figure_text.alt_text(svg, lang), "classes": "course-figure"}}
    fold_setup(nb, lang)
    extra = solutions_cell(english, lang)
    if extra is not None:
        nb.cells.append(extra)
    (out / "notebooks").mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out / page)
    (out / "_downloads_" / "ipynb").mkdir(parents=True, exist_ok=True)
    shutil.copy2(source, out / "_downloads_" / "ipynb" / source.name)


def stage_markdown(source: Path, page: str, lang: str, out: Path, toctree: str = "", title: str | None = None) -> None:
    """A markdown page (README, glossary, source article) with its links rewritten (and its title, when given)."""
    text = rewrite_links(source.read_text(encoding="utf-8"), source, page, lang)
    text = re.sub(r"\A# .*", f"# {title}", text) if title else text
    (out / page).parent.mkdir(parents=True, exist_ok=True)
    (out / page).write_text(text + toctree, encoding="utf-8")


def front_page(lang: str) -> str:
    """The site's landing page (site/front/): what the course is, for whom, where to start, the route and its times."""
    first, home = english_notebooks()[0], repository.home()
    start_row = route_rows(lang)[first.name[:2]]  # the start card's times: 00's row of the route
    fills = {"start": f"notebooks/{first.stem}", "start_title": title(source_of(lang, first)), "route": route_table(lang),
             "start_core": start_row[3], "start_all": start_row[4],
             "core_minutes": str(core_minutes(lang)), "repository": home.url, "issues": f"{home.url}/issues"}
    return filled((SITE / "front" / f"{lang}.md").read_text(encoding="utf-8"), fills)


def filled(text: str, fills: dict[str, str]) -> str:
    """A template of site/front/ with each {name} replaced by its value."""
    for key, value in fills.items():
        text = text.replace("{" + key + "}", value)
    return text


def not_found_page(out: Path) -> None:
    """OUT/404.html, both languages (site/front/404.html): GitHub Pages shows it at any address of
    the site that has no page. It links both front pages and ends with the pages' footer; it loads
    nothing, so it works in any folder."""
    icon = (SITE / "_static" / "favicon.svg").read_text(encoding="utf-8").strip()
    folders = sorted(p.name for p in out.iterdir() if p.is_dir())  # where its script finds the root
    fills = {"favicon": "data:image/svg+xml," + urllib.parse.quote(icon), "footer": footer(),
             "folders": json.dumps(folders), "title_en": html.escape(LANGS["en"]["title"]),
             "title_zh": html.escape(LANGS["zh-CN"]["title"])}
    template = (SITE / "front" / "404.html").read_text(encoding="utf-8")
    (out / "404.html").write_text(filled(template, fills), encoding="utf-8")


def footer() -> str:
    """The pages' footer (site/_templates/licence.html) as HTML, a line per language: the licence,
    this build's date and commit, where to report a problem."""
    home = home_links()
    commit = home["commit"]
    if home["commit_url"]:
        commit = f'<a href="{home["commit_url"]}">{commit}</a>'
    lines = []
    for words in LANGS.values():
        built = words["built"].format(date=home["date"], commit=commit)
        changes = words["changes"] if home["changes"] else ""
        licence = f'<a href="{home["licence"]}">{words["licence"]}</a>'
        report = f'<a class="course-report" href="{home["issues"]}">{words["report"]}</a>'
        lines.append(f'<p lang="{words["code"]}">{licence} · '
                     f'<span class="course-built">{built}{changes}</span> · {report}</p>')
    return "\n".join(lines)


def route_table(lang: str) -> str:
    """Notebook 00's route table, each notebook's name a link to its page."""
    lines = [line for line in route_markdown(lang).splitlines() if line.startswith("|")]
    pages_by_number = {nb.name[:2]: nb.name for nb in english_notebooks()}
    rows = [[re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell) for cell in cells]  # the notebook's own links dropped
            for cells in route_rows(lang).values()]
    body = [f"| {r[0]} | [{r[1]}](notebooks/{pages_by_number[r[0]]}) | " + " | ".join(r[2:]) + " |" for r in rows]
    return "\n".join(lines[:2] + body)


def core_minutes(lang: str) -> int:
    """The core route's time: the sum of the minutes in notebook 00's 'on the core route' column."""
    return sum(int(re.search(r"\d+", r[3])[0]) for r in route_rows(lang).values() if re.search(r"\d", r[3]))


def toctree(lang: str) -> str:
    """The sidebar: the route's notebooks with their times, then the glossary and the source article."""
    entries = "\n".join(f"{title} <{page}>" for page, title in route(lang))
    return (f"\n\n```{{toctree}}\n:hidden:\n:caption: {LANGS[lang]['route']}\n\n{entries}\n```\n\n"
            f"```{{toctree}}\n:hidden:\n\n{LANGS[lang]['readme_title']} <readme>\ndocs/glossary\ndocs/source-article\n```\n")


def jieba_dict(out: Path) -> Path:
    """The glossary's Chinese terms as a jieba dictionary, so that the search index keeps each term whole."""
    terms = set()
    for line in (ROOT / "docs" / "glossary.md").read_text(encoding="utf-8").splitlines():
        cells = line.split("|")
        if len(cells) > 3:
            terms.update(HAN.findall(cells[2]))
    path = out / "jieba_dict.txt"
    path.write_text("".join(f"{t} 100000\n" for t in sorted(terms)), encoding="utf-8")
    return path


def mathjax(out: Path) -> Path:
    """MathJax 3 (TeX in, HTML out, its fonts, what it loads on demand) copied from the sphinx-mathjax-offline package."""
    from importlib.metadata import distribution

    static = Path(distribution("sphinx-mathjax-offline").locate_file("sphinx-mathjax-offline/static/mathjax"))
    dest = out / "_mathjax_" / "mathjax"
    for part in ("tex-chtml.js", "output/chtml", "input/tex/extensions", "ui", "a11y"):
        if (static / part).is_dir():
            shutil.copytree(static / part, dest / part, dirs_exist_ok=True)
        else:
            (dest / part).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(static / part, dest / part)
    return dest.parent


def stage(lang: str, out: Path) -> dict:
    """Every source file of one language's site, in out/; returns what conf.py reads."""
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / "index.md").write_text(front_page(lang) + toctree(lang), encoding="utf-8")
    # the README's own title: the front page's would show twice in search and after notebook 11
    stage_markdown(ROOT / LANGS[lang]["readme"], "readme.md", lang, out, title=LANGS[lang]["readme_title"])
    for doc in DOCS:
        stage_markdown(source_of(lang, ROOT / "docs" / f"{doc}.md"), f"docs/{doc}.md", lang, out)
    for nb in english_notebooks():
        stage_notebook(nb, lang, out)
    other = next(v for k, v in LANGS.items() if k != lang)
    words = LANGS[lang]
    return {"lang": lang, "title": words["title"], "home": home_links(), "mathjax": str(mathjax(out)),
            "downloads": str(out / "_downloads_"), "jieba_dict": str(jieba_dict(out)),
            "other": {"name": other["name"], "code": other["code"],  # root: the other site, from this one's root
                      "root": os.path.relpath(other["root"] or ".", words["root"] or ".") + "/"},
            "labels": {k: words[k] for k in ("suffix", "colab", "kaggle", "download", "licence", "changes", "report")},
            "built": words["built"], "description": words["description"]}


def home_links() -> dict:
    """Where the pages link into the repository (pyproject.toml's), and the commit and date of this build."""
    where = repository.home()
    return {"url": where.url, "branch": where.branch, "colab": where.colab(""), "kaggle": where.kaggle(""), "licence": where.file("LICENSE"),
            "issues": f"{where.url}/issues", **built_from()}


def built_from() -> dict:
    """This build's commit (short; `changes` when the checkout differs from it) and UTC date (SOURCE_DATE_EPOCH's)."""
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True)
        return done.stdout.strip() if done.returncode == 0 else ""

    sha = git("rev-parse", "HEAD")
    stamp = time.gmtime(int(os.environ.get("SOURCE_DATE_EPOCH", time.time())))
    return {"commit": sha[:7] or "unknown", "commit_url": f"{repository.home().url}/commit/{sha}" if sha else "",
            "changes": bool(git("status", "--porcelain", "--untracked-files=no")), "date": time.strftime("%Y-%m-%d", stamp)}


def build(out: Path, work: Path) -> None:
    """Both languages: English in out/, Chinese in out/zh-CN/."""
    shutil.rmtree(out, ignore_errors=True)
    for lang, words in LANGS.items():
        began = time.monotonic()
        settings = stage(lang, work / lang)
        dest = out / words["root"]
        cmd = [sys.executable, "-m", "sphinx", "-b", "html", "-q", "-c", str(SITE), str(work / lang), str(dest)]
        subprocess.run(cmd, check=True, env={**os.environ, "DP_SITE_STAGE": json.dumps(settings)})
        site_assets.lighten(dest, skip=tuple(w["root"].strip("/") for w in LANGS.values() if w["root"]))
        print(f"{lang}: {dest} ({time.monotonic() - began:.0f} s)")
    not_found_page(out)
    (out / ".nojekyll").write_text("")  # GitHub Pages: serve _static/ as it is


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "site", help="where the site is written")
    args = parser.parse_args(argv)
    build(args.out.resolve(), ROOT / "build" / "site-src")
    print(f"open {args.out / 'index.html'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
