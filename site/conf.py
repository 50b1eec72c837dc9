"""Sphinx configuration of the course website, one build per language (tools/site.py stages the sources and runs it)."""

import json
import os
import re
from pathlib import Path

from docutils import nodes
from sphinx.search import languages
from sphinx.search.zh import SearchChinese

here = Path(__file__).resolve().parent
stage = json.loads(os.environ["DP_SITE_STAGE"])  # what tools/site.py staged: language, title, paths, labels

project = stage["title"]
language = "en" if stage["lang"] == "en" else "zh_CN"  # zh_CN: Sphinx's Chinese search, segmented by jieba
extensions = ["myst_nb", "sphinx_copybutton", "sphinx_design"]
templates_path = [str(here / "_templates")]
html_static_path = [str(here / "_static"), stage["mathjax"]]
html_extra_path = [stage["downloads"]]  # each notebook's .ipynb, for the download link
html_css_files = ["course.css"]
html_js_files = ["course.js"] + ([("search-split.js", {"priority": 1})] if stage["lang"] != "en" else [])  # 1: first
html_search_options = {"dict": stage["jieba_dict"]} if stage["lang"] != "en" else {}
exclude_patterns = ["_build", "_downloads_", "_mathjax_"]


class SearchChineseWords(SearchChinese):
    """Sphinx's Chinese search keeping one-character words (桶, 步, 秩): Chinese has many; Latin ones stay dropped."""

    def word_filter(self, stemmed_word: str) -> bool:
        return super().word_filter(stemmed_word) or bool(re.fullmatch(r"[\u4e00-\u9fff]", stemmed_word))


languages["zh"] = SearchChineseWords  # the class Sphinx builds the zh_CN index with

nb_execution_mode = "off"  # the committed notebooks are executed already: the site shows their outputs
nb_merge_streams = True
myst_enable_extensions = ["colon_fence", "dollarmath", "amsmath"]
myst_heading_anchors = 3
suppress_warnings = ["myst.header", "mystnb.unknown_mime_type"]

# MathJax 3 from the site itself (a copy of a registry package's, tools/site.py), never a CDN: the site works offline
mathjax_path = "mathjax/tex-chtml.js"

html_theme = "sphinx_book_theme"
html_title = project
html_show_sourcelink = False
html_copy_source = False
html_last_updated_fmt = None
html_context = {"default_mode": "auto", "other_lang": stage["other"], "home": stage["home"], "labels": stage["labels"],
                "built": stage["built"], "description": stage["description"]}
html_theme_options = {
    "show_toc_level": 2,
    "use_download_button": False,
    "use_fullscreen_button": False,
    # the theme's own buttons (repository, theme, search, contents) after the course's links: at every width
    "article_header_end": ["course-links.html", "article-header-buttons.html"],
    "repository_url": stage["home"]["url"],
    "repository_branch": stage["home"]["branch"],
    "use_repository_button": True,
    "home_page_in_toc": True,
    "navigation_with_keys": False,
    "footer_content_items": ["licence.html"],
}
html_favicon = str(here / "_static" / "favicon.svg")


def leave_setup_out_of_search(app, doctree) -> None:
    """Every notebook's setup cell (tools/site.py tags it) is the same clone and imports: Sphinx
    indexes no words of an element with the class no-search; course.js drops it from excerpts."""
    for node in doctree.findall(nodes.container):
        if "tag_course-setup" in node["classes"]:
            node["classes"].append("no-search")


def setup(app) -> None:
    app.connect("doctree-read", leave_setup_out_of_search)
