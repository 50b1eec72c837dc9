"""The Chinese edition: notebooks/NN_name.zh-CN.ipynb, built from the English notebook and i18n/zh-CN/NN_name.md.

A translation file is a list of blocks, one per translated cell, each under a header naming the English cell
(its id), its kind and the hash of the English source it translates:

    <!-- cell 3f2a9c1e · markdown · en 5d41402abc4b -->
    中文……

Every markdown cell has a block; a code cell has one only where its comments or its strings are translated, and its
code must stay the English cell's token for token (comments and blank lines aside), except a string that a figure
or a message shows, which may be Chinese (with the same {placeholders} in the same order). When an English cell
changes, its block's hash no longer matches and the build names the notebook and cell.

The edition is executed on its own (`tools/notebooks.py execute` runs both): its figures are drawn in Chinese and
its checkers speak Chinese. A build keeps the outputs of the edition's last run; the run records the hash of the
code it ran (metadata "dp_course": "executed_code"), so that code changed since is named as needing a new run.
"""

from __future__ import annotations

import ast
import hashlib
import io
import re
import tokenize
from dataclasses import dataclass
from pathlib import Path

import nbformat

REPO = Path(__file__).resolve().parent.parent
NOTEBOOKS = REPO / "notebooks"
TRANSLATIONS = REPO / "i18n" / "zh-CN"
SUFFIX = ".zh-CN.ipynb"
HEADER = re.compile(r"^<!-- cell (?P<id>[\w-]+) · (?P<kind>markdown|code) · en (?P<hash>[0-9a-f]{12}) -->$")
# the Chinese edition's checkers speak Chinese: two lines the build adds at the end of the setup cell
LANGUAGE_LINES = 'from dp_helpers.course.i18n import set_language\nset_language("zh-CN")  # 检查器的提示、图中的文字和打印的结果改用中文'
ZH_SKELETON = ("学习目标", "小结", "练习")  # the English skeleton's What you'll learn, Takeaways, Exercises
POINTER = "## 中文版"  # the English notebook's second cell, a link to its Chinese edition: the edition links back
CHINESE_POINTER = (POINTER + "\n本笔记本的简体中文版：[`{name}`]({name})。正文、练习、检查器的提示和图中的文字都是中文，"
                   "课程代码打印的结果也是。中文版单独运行，输出来自它自己的那次运行。")
ENGLISH_POINTER = "## English\nThe English original of this notebook: [`{name}`]({name})."
CJK = re.compile(r"[\u4e00-\u9fff]")
NOTEBOOK_LINK = re.compile(r"(?<![\w.])(\d\d_\w+)\.ipynb\b")  # a link to a lesson, in a markdown cell


@dataclass
class Block:
    """One translated cell: the English cell's id, its kind, the hash of the English it translates, the text."""

    cell: str
    kind: str
    en: str
    text: str

    def header(self) -> str:
        return f"<!-- cell {self.cell} · {self.kind} · en {self.en} -->"


def english_notebooks() -> list[Path]:
    """The lessons, in order, without their Chinese editions."""
    return sorted(p for p in NOTEBOOKS.glob("[0-9][0-9]_*.ipynb") if not p.name.endswith(SUFFIX))


def edition_of(english: Path) -> Path:
    """Where a lesson's Chinese edition lives: beside it, so that its links and files resolve the same."""
    return english.with_name(english.stem + SUFFIX)


def translation_of(english: Path) -> Path:
    """The translation file of a lesson."""
    return TRANSLATIONS / f"{english.stem}.md"


def source_hash(source: str) -> str:
    """What a block records of the English cell it translates."""
    return hashlib.sha256(source.encode()).hexdigest()[:12]


def read_blocks(path: Path) -> list[Block]:
    """The blocks of a translation file, in order (text before the first header is a comment for translators)."""
    blocks: list[Block] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        match = HEADER.match(line)
        if match:
            blocks.append(Block(match["id"], match["kind"], match["hash"], ""))
        elif blocks:
            blocks[-1].text += line + "\n"
    for block in blocks:
        block.text = block.text.strip("\n")
    return blocks


def write_blocks(path: Path, title: str, blocks: list[Block]) -> None:
    """A translation file: a one-line comment, then each block under its header."""
    path.parent.mkdir(parents=True, exist_ok=True)
    body = "\n\n".join(f"{b.header()}\n{b.text}" for b in blocks)
    path.write_text(f"<!-- {title}: the Simplified-Chinese edition's text; see tools/edition.py -->\n\n{body}\n",
                    encoding="utf-8")


def tokens(source: str) -> list[tokenize.TokenInfo] | None:
    """A code cell's Python tokens, IPython magics kept whole as strings (None: not Python)."""
    lines = [repr(line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    try:
        return list(tokenize.generate_tokens(io.StringIO("\n".join(lines) + "\n").readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return None


FSTRING_START, FSTRING_END = getattr(tokenize, "FSTRING_START", None), getattr(tokenize, "FSTRING_END", None)


def code_tokens(source: str) -> list[tuple[int, str]] | str:
    """A code cell as its tokens without comments or blank lines: what a translation must keep."""
    found = tokens(source)
    if found is None:
        return source  # not Python: the text itself must match
    return [(t.type, t.string) for t in whole_fstrings(found, source) if t.type not in (tokenize.COMMENT, tokenize.NL)]


def whole_fstrings(found: list[tokenize.TokenInfo], source: str) -> list[tokenize.TokenInfo]:
    """Python 3.12+ cuts an f-string into pieces: put each back together as one STRING token, as 3.11 reads it."""
    if FSTRING_START is None:
        return found
    lines = [repr(line) if line.lstrip().startswith(("%", "!")) else line for line in source.splitlines()]
    lines = [line + "\n" for line in lines]
    merged, depth, start = [], 0, None
    for t in found:
        if t.type == FSTRING_START:
            depth, start = depth + 1, start if depth else t.start
        elif t.type == FSTRING_END and depth == 1:
            text = "".join(lines[start[0] - 1:t.end[0]])[start[1]:]
            text = text[:len(text) - len(lines[t.end[0] - 1]) + t.end[1]]
            merged.append(tokenize.TokenInfo(tokenize.STRING, text, start, t.end, t.line))
            depth = 0
        elif t.type == FSTRING_END:
            depth -= 1
        elif not depth:
            merged.append(t)
    return merged


def same_code(english: str, chinese: str) -> bool:
    """Whether a translated cell is the English code: token for token, a string aside where it became Chinese."""
    en, zh = code_tokens(english), code_tokens(chinese)
    if isinstance(en, str) or isinstance(zh, str) or len(en) != len(zh):
        return en == zh
    return all(e == z or translated_string(e, z) for e, z in zip(en, zh, strict=True))


TEXT_TOKENS = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}  # 3.12+: an f-string's text


def translated_string(english: tuple[int, str], chinese: tuple[int, str]) -> bool:
    """A string token put into Chinese: the same kind of token, Chinese text, the same placeholders in order."""
    return (english[0] == chinese[0] in TEXT_TOKENS and bool(CJK.search(chinese[1]))
            and placeholders(english) == placeholders(chinese))


def placeholders(token: tuple[int, str]) -> list[str] | None:
    """The {expressions} of an f-string token, in order (none for a plain string; None where it is no literal)."""
    if token[0] != tokenize.STRING:
        return []  # an f-string's text between its {}: its placeholders are tokens of their own
    try:
        tree = ast.parse(token[1], mode="eval")
    except SyntaxError:
        return None
    return [ast.dump(node) for node in ast.walk(tree) if isinstance(node, ast.FormattedValue)]


def has_comments(source: str) -> bool:
    """Whether a code cell has a comment a translation could turn into Chinese."""
    return any(t.type == tokenize.COMMENT for t in tokens(source) or [])


def is_setup(cell) -> bool:
    """The first code cell, the one that imports the package: the Chinese edition adds its language there."""
    return cell.cell_type == "code" and "from dp_helpers" in cell.source


# pages that have a Chinese version of their own: a link from the edition goes there
CHINESE_PAGES = {"../docs/source-article.md": "../docs/source-article.zh-CN.md", "../README.md": "../README.zh-CN.md"}


def localise(markdown: str) -> str:
    """Links to other lessons, and to pages with a Chinese version, go to the Chinese ones (the badges too)."""
    markdown = NOTEBOOK_LINK.sub(lambda m: m[1] + SUFFIX, markdown)
    for english, chinese in CHINESE_PAGES.items():
        markdown = re.sub(rf"\]\({re.escape(english)}(?=[)#])", f"]({chinese}", markdown)
    return markdown


def build(english: Path) -> tuple[nbformat.NotebookNode, list[str]]:
    """The Chinese edition of one lesson, and every problem with its translation (empty when it is up to date)."""
    nb = nbformat.read(english, as_version=4)
    path = translation_of(english)
    blocks = {b.cell: b for b in read_blocks(path)} if path.exists() else {}
    problems, setup_done = [], False
    for i, cell in enumerate(nb.cells):
        where = f"{english.name} cell {i} (id {cell.id}, {cell.cell_type})"
        source, problem = translated(cell, blocks.pop(cell.id, None), where, rel(path))
        if is_pointer(i, cell):
            source, problem = ENGLISH_POINTER.format(name=english.name), None
        problems += [problem] if problem else []
        cell.source = source
        if is_setup(cell) and not setup_done:
            cell.source, setup_done = with_language(cell.source), True
    problems += [f"{rel(path)} translates cell {c}, which {english.name} no longer has" for c in blocks]
    if not setup_done:
        problems.append(f"{english.name} has no setup cell importing dp_helpers to set the language in")
    text = "\n".join(c.source for c in nb.cells if c.cell_type == "markdown")
    problems += [f"{english.name}: its translation has no heading '{h}'" for h in ZH_SKELETON if f"## {h}" not in text]
    nb.metadata["language"] = "zh-CN"  # what a reader of the file sees it is
    keep_last_run(nb, edition_of(english))
    return nb, problems


def keep_last_run(nb, target: Path) -> None:
    """Give each code cell the outputs of the edition's last run (none for a cell it did not have) and its stamp."""
    last = nbformat.read(target, as_version=4) if target.exists() else nbformat.v4.new_notebook()
    ran = {c.id: c for c in last.cells if c.cell_type == "code"}
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        cell.outputs, cell.execution_count = (ran[cell.id].outputs, ran[cell.id].execution_count) if cell.id in ran \
            else ([], None)
    nb.metadata.pop(RUN_KEY, None)
    if RUN_KEY in last.metadata:
        nb.metadata[RUN_KEY] = last.metadata[RUN_KEY]


RUN_KEY = "dp_course"  # {"executed_code": the hash of the code the edition's committed outputs come from}
# (its tokens: a comment translated again needs no new run)


def code_hash(nb) -> str:
    """The hash of a notebook's code, cell by cell, without comments: what a run's outputs come from."""
    return source_hash(repr([code_tokens(c.source) for c in nb.cells if c.cell_type == "code"]))


def stamp_run(path: Path) -> None:
    """Record, in an executed edition, the code its outputs come from."""
    nb = nbformat.read(path, as_version=4)
    nb.metadata[RUN_KEY] = {"executed_code": code_hash(nb)}
    path.write_text(as_text(nb), encoding="utf-8")


def unclean_run(code: list) -> tuple[list[str], list[str]]:
    """A committed run's code cells: (execution counts that are not 1..n, error outputs), each as a sentence or none."""
    counts = [c.execution_count for c in code]
    errors = [i for i, c in enumerate(code, 1) if any(o.output_type == "error" for o in c.outputs)]
    return ([f"execution counts are {counts[:10]}..., not one clean run 1..{len(code)}"]
            if counts != list(range(1, len(code) + 1)) else [],
            [f"error outputs in code cells {errors}"] if errors else [])


def run_problems(nb, name: str) -> list[str]:
    """What is wrong with an edition's outputs: not from one clean run of its current code, or an error among them."""
    counts, errors = unclean_run([c for c in nb.cells if c.cell_type == "code"])
    if nb.metadata.get(RUN_KEY, {}).get("executed_code") != code_hash(nb):
        counts = [f"outputs do not come from its current code: run python tools/notebooks.py execute "
                  f"notebooks/{name.replace(SUFFIX, '.ipynb')}"]  # a new run: its counts are beside the point
    return [f"{name}: {problem}" for problem in counts + errors]


def translated(cell, block: Block | None, where: str, path: str) -> tuple[str, str | None]:
    """A cell's Chinese source (its English one where it has none yet) and the problem with its block, if any."""
    if block is not None and block.en != source_hash(cell.source):
        return cell.source, (f"{where} changed since it was translated: update its block in {path} and set its "
                             f"header to 'en {source_hash(cell.source)}'")
    if cell.cell_type == "markdown":
        if block is None:
            return cell.source, f"{where} has no translation in {path}"
        if block.text == cell.source or not CJK.search(block.text):
            return cell.source, f"{where} is still in English in {path}"
        broken = soft_breaks(block.text)
        if broken:
            return cell.source, (f"{where}: its translation in {path} breaks a line after '{broken[0]}', "
                                 "which a browser shows as a space: join the paragraph's lines")
        return localise(block.text), None
    if block is None:
        return cell.source, None  # code whose comments are not translated: the English cell as it is
    if not same_code(cell.source, block.text):
        return cell.source, f"{where}: its translation in {path} changes the code, not only its comments and text"
    return block.text, None


MARKUP = re.compile(r"^(#|\||```|<!--|[-*+] |\d+\. |> |\$\$|:|\{)")  # a line that starts a block, not a paragraph's next


def soft_breaks(markdown: str) -> list[str]:
    """Lines of a Chinese paragraph broken after a CJK character: a browser shows the break as a space (构建 模型)."""
    found, fence, lines = [], False, markdown.split("\n")
    for line, after in zip(lines, lines[1:], strict=False):
        fence = fence != line.strip().startswith("```")
        text, nxt = line.rstrip(), after.strip()
        if not fence and text and nxt and ord(text[-1]) >= 0x2E80 and not MARKUP.match(nxt) \
                and not text.lstrip().startswith(("|", "#")):
            found.append(text[-20:])
    return found


def is_pointer(index: int, cell) -> bool:
    """The English notebook's link to its Chinese edition, which the edition replaces by a link back."""
    return index == 1 and cell.cell_type == "markdown" and cell.source.startswith(POINTER)


def with_language(source: str) -> str:
    """A setup cell that sets the language before the last line prints the machine's report (else at its end)."""
    lines = source.rstrip("\n").split("\n")
    at = len(lines) - 1 if lines[-1].startswith("print(") else len(lines)
    return "\n".join(lines[:at] + [LANGUAGE_LINES] + lines[at:])


def without_language(source: str) -> str:
    """A Chinese setup cell's source without the lines the build added: the English cell's again."""
    return source.replace("\n" + LANGUAGE_LINES, "", 1)


def skeleton(english: Path) -> int:
    """Add a block, in English, for every cell the translation lacks (kept in the notebook's order); return how many."""
    nb = nbformat.read(english, as_version=4)
    path = translation_of(english)
    have = {b.cell: b for b in read_blocks(path)} if path.exists() else {}
    blocks, added = [], 0
    for i, cell in enumerate(nb.cells):
        if cell.id in have:
            blocks.append(have.pop(cell.id))
        elif is_pointer(i, cell):
            continue
        elif cell.cell_type == "markdown" or has_comments(cell.source):
            blocks.append(Block(cell.id, cell.cell_type, source_hash(cell.source), cell.source))
            added += 1
    write_blocks(path, english.name, blocks + list(have.values()))
    return added


def rel(path: Path) -> str:
    """A path as the repository names it."""
    return str(path.relative_to(REPO)) if path.is_relative_to(REPO) else str(path)


def as_text(nb) -> str:
    """A notebook as nbformat writes it: what a committed edition is compared with."""
    return nbformat.writes(nb) + "\n"


def translate(paths: list[Path]) -> dict[str, list[str]]:
    """Build and write the Chinese edition of each lesson whose translation is complete; each lesson's problems."""
    found = {}
    for english in paths:
        nb, found[english.name] = build(english)
        if not found[english.name]:
            edition_of(english).write_text(as_text(nb), encoding="utf-8")
    return found


def stale_editions(paths: list[Path]) -> list[str]:
    """Problems of the committed Chinese editions: a translation out of step, or a build not redone since."""
    found = []
    for english in paths:
        nb, problems = build(english)
        found += problems
        target = edition_of(english)
        if not problems and (not target.exists() or target.read_text(encoding="utf-8") != as_text(nb)):
            found.append(f"{rel(target)} is not the build of {english.name} and its translation: "
                         "run python tools/notebooks.py translate")
        elif not problems:
            found += run_problems(nb, target.name)
    return found
