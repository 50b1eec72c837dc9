"""tools/site.py's staging, without Sphinx: the sidebar's route, the links between pages, the solutions, the dictionary."""

import re

from tools import site

NB03 = site.ROOT / "notebooks" / "03_ddp_sampler_allreduce.ipynb"


def test_the_sidebar_route_is_notebook_00s_table_in_each_language():
    en, zh = site.route("en"), site.route("zh-CN")
    assert [p for p, _ in en] == [p for p, _ in zh] == [f"notebooks/{nb.stem}" for nb in site.english_notebooks()]
    assert all(re.match(r"\d\d · .+ · \d+ min", title) for _, title in en), en
    optional = [page[10:12] for page, title in en if title.endswith("optional")]
    assert optional == ["01", "02", "04", "05", "09", "10", "11"] and all("选读" in zh[int(n)][1] for n in optional)


def test_links_become_links_between_pages_or_to_the_repository():
    readme = site.ROOT / "README.md"
    text = ("[a](notebooks/03_ddp_sampler_allreduce.ipynb#top) [b](dp_helpers/scripts/article_spawn.py) "
            "[c](README.zh-CN.md) [d](https://pytorch.org) [e](#quick-start)")
    out = site.rewrite_links(text, readme, "index.md", "en")
    assert "[a](notebooks/03_ddp_sampler_allreduce.ipynb#top)" in out
    assert f"[b]({site.repository.home().file('dp_helpers/scripts/article_spawn.py')})" in out
    assert '<a href="zh-CN/readme.html">c</a>' in out and "[d](https://pytorch.org)" in out and "[e](#quick-start)" in out
    zh = site.rewrite_links("[`03.ipynb`](03_ddp_sampler_allreduce.ipynb) [g](../docs/glossary.md)",
                            NB03.with_name(NB03.stem + ".zh-CN.ipynb"), "notebooks/03_ddp_sampler_allreduce.ipynb",
                            "zh-CN")
    assert '<a href="../../notebooks/03_ddp_sampler_allreduce.html"><code>03.ipynb</code></a>' in zh
    assert "[g](../docs/glossary.md)" in zh


def test_the_badges_go_since_every_page_header_links_colab_and_kaggle():
    badge = ("[![Open In Colab](https://colab.research.google.com/assets/colab-badge.svg)](https://colab.research."
             "google.com/github/x/y/blob/main/notebooks/a.ipynb)")
    assert "colab-badge.svg" not in site.rewrite_links(f"# T\n\n{badge}\n", NB03, "notebooks/a.ipynb", "en")


def test_each_solution_is_a_closed_dropdown_at_the_end():
    cell = site.solutions_cell(NB03, "zh-CN")
    files = sorted((site.ROOT / "solutions").glob("03_*.py"))
    assert cell.source.startswith("## 参考答案") and cell.source.count(":class-container: solution") == len(files)
    assert all(f.read_text(encoding="utf-8").strip() in cell.source for f in files) and ":open:" not in cell.source


def test_the_glossary_terms_are_whole_words_for_the_chinese_index(tmp_path):
    words = site.jieba_dict(tmp_path).read_text(encoding="utf-8").split()
    assert "梯度累积" in words and "全归约" in words and "gradient" not in words


def test_the_front_page_says_where_to_start_and_lists_the_route_with_its_times():
    for lang in ("en", "zh-CN"):
        page = site.front_page(lang)
        assert ":link: notebooks/00_ddp_in_one_picture" in page and "{" + "route}" not in page
        for nb in site.english_notebooks():
            assert f"](notebooks/{nb.name})" in page, (lang, nb.name)
        assert "(readme.md)" in page and f"{site.repository.home().url}/issues" in page
    said = re.search(r"The core route adds up to (\d+) minutes", (site.ROOT / "notebooks" / "00_ddp_in_one_picture.ipynb")
                     .read_text(encoding="utf-8"))
    assert said and site.core_minutes("en") == site.core_minutes("zh-CN") == int(said[1])
