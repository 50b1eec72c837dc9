"""The repository and branch live in pyproject.toml alone: tools/repository.py writes them into every notebook."""

import shutil
import subprocess
import sys

import pytest

from tools import repository

FORK = repository.Home("https://github.com/someone/dp-fork", "teach")


def test_stamp_points_badges_and_the_clone_at_another_repository():
    home = repository.home()
    text = (f"[![Open In Colab](x.svg)]({home.colab('notebooks/03_a.ipynb')}) "
            f"[![Open In Kaggle](y.svg)]({home.kaggle('notebooks/03_a.ipynb')})\n"
            "    subprocess.run([\"git\", \"clone\", \"-q\", \"--depth\", \"1\", \"https://github.com/a/b\", \"dp-course\"], "
            "check=True)\nother https://github.com/pytorch/pytorch text")
    out = repository.stamp(text, FORK)
    assert FORK.colab("notebooks/03_a.ipynb") in out and FORK.kaggle("notebooks/03_a.ipynb") in out
    assert '"-b", "teach", "https://github.com/someone/dp-fork", "dp-course"], check=True)' in out
    assert home.slug not in out and "https://github.com/pytorch/pytorch text" in out
    assert repository.stamp(out, FORK) == out


@pytest.mark.parametrize("url, branch", [("https://gitlab.com/a/b", "main"), ("https://github.com/a/b", "")])
def test_a_repository_colab_cannot_open_is_one_sentence(tmp_path, url, branch):
    (tmp_path / "pyproject.toml").write_text(f'[project.urls]\nRepository = "{url}"\n[tool.dp-course]\nbranch = "{branch}"\n')
    with pytest.raises(ValueError, match="must name a GitHub repository"):
        repository.home(tmp_path)


@pytest.mark.slow
@pytest.mark.long  # copies the repository and rewrites every notebook: ~6 s
def test_a_fork_changes_pyproject_and_no_old_url_is_left_anywhere(tmp_path):
    root, home = repository.ROOT, repository.home()
    files = subprocess.run(["git", "ls-files"], cwd=root, capture_output=True, text=True, check=True).stdout.split()
    copy = tmp_path / "copy"
    for name in files:
        (copy / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(root / name, copy / name)
    meta = (copy / "pyproject.toml").read_text(encoding="utf-8")
    meta = meta.replace(f'Repository = "{home.url}"', f'Repository = "{FORK.url}"')
    (copy / "pyproject.toml").write_text(meta.replace(f'branch = "{home.branch}"', 'branch = "teach"'), encoding="utf-8")
    done = subprocess.run([sys.executable, "tools/repository.py"], cwd=copy, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    left = [name for name in files if home.slug in (copy / name).read_text(encoding="utf-8", errors="replace")]
    assert left == []
    checked = subprocess.run([sys.executable, "tools/notebooks.py", "check"], cwd=copy, capture_output=True, text=True,
                             timeout=300)
    assert checked.returncode == 0, checked.stdout[-2000:]  # every Chinese edition still built from current English
