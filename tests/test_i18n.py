"""The checkers speak the notebook's language: every message template has its Chinese entry, and English stays English."""

import ast
import string
from pathlib import Path

import pytest

from dp_helpers.course.checkers import exercises as ex
from dp_helpers.course.checkers import script_check as sc
from dp_helpers.tool import i18n
from dp_helpers.tool.messages_zh import MESSAGES

PACKAGE = Path(i18n.__file__).resolve().parents[1]  # dp_helpers
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if "templates" not in p.parts)
MARKERS = ("tr", "tr_later")  # tr(template, ...) and a table's tr_later(template)


def called(call: ast.Call) -> str | None:
    """The name a call calls: `tr` for tr(...) and for i18n.tr(...)."""
    return getattr(call.func, "id", None) or getattr(call.func, "attr", None)


def marker_calls() -> list[tuple[str, ast.Call]]:
    """Every call of tr or tr_later in the package, with where it is."""
    calls = []
    for path in SOURCES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and called(node) in MARKERS:
                calls.append((f"{path.relative_to(PACKAGE.parent)}:{node.lineno}", node))
    return calls


def templates() -> dict[str, str]:
    """Every template the package passes to tr() or marks with tr_later(), and where it first appears."""
    found = {}
    for where, call in marker_calls():
        first = call.args[0] if call.args else None
        if isinstance(first, ast.Constant) and isinstance(first.value, str):
            found.setdefault(first.value, where)
    return found


def placeholders(template: str) -> set[tuple[str, str | None, str | None]]:
    """The template's replacement fields: name, conversion and format spec of each."""
    return {(name, conversion, spec) for _, name, spec, conversion in string.Formatter().parse(template)
            if name is not None}


@pytest.fixture
def language():
    """set_language, with the language the test found put back afterwards whatever happens."""
    before = i18n.language()
    try:
        yield i18n.set_language
    finally:
        i18n.set_language(before)


def test_the_static_search_finds_the_checkers_templates():
    found = templates()
    assert len(found) > 100  # the search itself works: a broken one would pass the tests below vacuously
    assert "correct: {message}" in found and "(every rank's output: {path})" in found
    assert ex.UNIT_SLIPS[8] in found and all(words in found for words in sc.ERROR_HINTS.values())


def test_a_table_marks_each_template_as_a_literal():
    """tr_later(...) is how a table's templates are found: a variable there would hide one from the tests."""
    hidden = [where for where, call in marker_calls()
              if called(call) == "tr_later" and not (call.args and isinstance(call.args[0], ast.Constant))]
    assert not hidden, f"tr_later() of something that is not a string literal at {hidden}"


def test_every_template_has_a_chinese_entry_with_the_same_placeholders():
    missing = {t: where for t, where in templates().items() if t not in MESSAGES}
    assert not missing, f"no entry in messages_zh.MESSAGES for {missing}"
    different = {t: (sorted(placeholders(t), key=str), sorted(placeholders(MESSAGES[t]), key=str))
                 for t in templates() if placeholders(t) != placeholders(MESSAGES[t])}
    assert not different, f"placeholders differ (template's, entry's): {different}"


KEPT_IN_ENGLISH = {"rank {rank}"}  # the glossary keeps rank as it is, rank（进程编号）, as the Chinese prose writes it


def test_every_entry_is_used_and_translated():
    unused = sorted(set(MESSAGES) - set(templates()))
    assert not unused, f"messages_zh.MESSAGES holds templates no code uses: {unused}"
    untranslated = sorted(t for t, zh in MESSAGES.items() if zh == t and t not in KEPT_IN_ENGLISH)
    assert not untranslated, f"entries left in English: {untranslated}"


def wrong_chunk(numel, world_size, rank):
    return rank * numel // world_size, (rank + 1) * numel // world_size


def test_a_checker_speaks_chinese_under_zh_cn_and_english_under_en(language, capsys):
    language("zh-CN")
    assert not ex.check_chunk(wrong_chunk)
    assert not ex.check_answer("01 rows for 17 on 5", [4, 4, 4, 4, 2])
    language("en")
    assert not ex.check_chunk(wrong_chunk)
    assert not ex.check_answer("01 rows for 17 on 5", [4, 4, 4, 4, 2])
    assert capsys.readouterr().out.splitlines() == [
        "还不对：对于 numel=1, world_size=2, rank=0，应得到 (0, 1)，实际得到 (0, 0)。",
        "还不对：你的答案中下标为 4 的值是 2；请对照本笔记本中的规则再试一次。",
        "not yet: for numel=1, world_size=2, rank=0 expected (0, 1), got (0, 0).",
        "not yet: the value at index 4 of your answer is 2; recheck the rule in this notebook and try again.",
    ]


def test_a_failed_run_is_explained_in_chinese_too(language, tmp_path):
    """message_problem reads the sentence failure_sentence wrote, in the language it was written in."""
    from dp_helpers.tool.launch import DistributedRunError

    hang = DistributedRunError("failed", ranks=(0,), cause="RuntimeError: Timed out waiting 4000ms")
    language("zh-CN")
    explained = sc.message_problem(sc.failure_sentence(hang, {}, 3, tmp_path), 3)
    assert explained.startswith("在 3 个 rank 上，有个 rank 等了")
    assert explained.endswith(f"（所有 rank 的输出：{tmp_path / 'console.log'}）。")
    language("en")
    explained = sc.message_problem(sc.failure_sentence(hang, {}, 3, tmp_path), 3)
    assert explained.startswith("on 3 ranks a rank waited")
    assert explained.endswith(f"(every rank's output: {tmp_path / 'console.log'}).")


def test_an_unknown_language_is_refused_in_one_sentence(language):
    language("zh-CN")
    with pytest.raises(ValueError, match=r"^language 'fr' is not one of en, zh-CN\.$") as refused:
        i18n.set_language("fr")
    assert str(refused.value).count(". ") == 0  # one sentence
    assert i18n.language() == "zh-CN"  # the refused call changed nothing


def without_docstrings(path: Path) -> str:
    """A module's code as its AST, docstrings removed (comments are not in the AST)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            node.body = body[1:] or [ast.Pass()]
    return ast.dump(tree)


@pytest.mark.parametrize("name", ["my_ddp_core.py", "my_zero1.py", "my_all_gather.py", "my_real_job.py", "my_fsdp.py",
                                  "one_device_loop.py"])
def test_each_starting_file_has_a_chinese_copy_with_the_same_code(name):
    english = (PACKAGE / "scripts" if name == "one_device_loop.py" else PACKAGE / "course" / "templates") / name
    chinese = sc.CHINESE_TEMPLATES / name
    assert without_docstrings(chinese) == without_docstrings(english)
    assert chinese.read_text(encoding="utf-8") != english.read_text(encoding="utf-8")  # its comments are Chinese


def test_the_chinese_edition_starts_from_the_chinese_file_and_either_counts_as_untouched(language, tmp_path, capsys):
    i18n.set_language("zh-CN")
    sc.start_my_zero1_exercise(str(tmp_path / "my_zero1.py"))
    assert (tmp_path / "my_zero1.py").read_text(encoding="utf-8") == (sc.CHINESE_TEMPLATES / "my_zero1.py").read_text(
        encoding="utf-8")
    assert sc.file_problem(tmp_path / "my_zero1.py", sc.ZERO1_TEMPLATE, "x") is not None  # untouched: not launched
    assert sc.same_as_template(tmp_path / "my_zero1.py", sc.ZERO1_TEMPLATE)
