"""`nox -s lint` fails when a committed rendered Dockerfile differs from a fresh render: the
comparing function names each file and shows a short diff (tools/rendered.py)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rendered_tool():
    spec = importlib.util.spec_from_file_location("rendered_tool", ROOT / "tools" / "rendered.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def tree(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_identical_trees_have_no_differences(tmp_path: Path) -> None:
    tool = rendered_tool()
    files = {"a/Dockerfile": "FROM x\nRUN true\n", "b/Dockerfile": "FROM y\n",
             "a/lock.txt": "only Dockerfiles are compared\n"}
    committed = tree(tmp_path / "committed", files)
    fresh = tree(tmp_path / "fresh", {**files, "a/lock.txt": "another lock\n"})
    assert tool.differences(committed, fresh) == []


def test_an_edited_dockerfile_is_named_with_its_diff(tmp_path: Path) -> None:
    tool = rendered_tool()
    committed = tree(tmp_path / "committed", {"a/Dockerfile": "FROM x\nRUN false\nUSER 1000\n",
                                              "b/Dockerfile": "FROM y\n"})
    fresh = tree(tmp_path / "fresh", {"a/Dockerfile": "FROM x\nRUN true\nUSER 1000\n",
                                      "b/Dockerfile": "FROM y\n"})
    [problem] = tool.differences(committed, fresh)
    lines = problem.splitlines()
    assert lines[0] == "error: rendered/a/Dockerfile differs from what `builder render` makes now"
    assert "-RUN false" in lines and "+RUN true" in lines


def test_a_long_diff_is_cut_short(tmp_path: Path) -> None:
    tool = rendered_tool()
    committed = tree(tmp_path / "committed", {"a/Dockerfile": "".join(f"RUN {i}\n" for i in range(99))})
    fresh = tree(tmp_path / "fresh", {"a/Dockerfile": "".join(f"RUN x{i}\n" for i in range(99))})
    [problem] = tool.differences(committed, fresh)
    assert len(problem.splitlines()) == 1 + tool.DIFF_LINES + 1
    assert problem.splitlines()[-1].endswith("more diff lines")


def test_missing_and_stale_files_are_named_and_update_fixes_both(tmp_path: Path) -> None:
    tool = rendered_tool()
    committed = tree(tmp_path / "committed", {"gone/Dockerfile": "FROM old\n"})
    fresh = tree(tmp_path / "fresh", {"new/Dockerfile": "FROM new\n"})
    assert tool.differences(committed, fresh) == [
        "error: rendered/gone/Dockerfile is committed but no variant renders it any more",
        "error: rendered/new/Dockerfile is not committed (a new variant?)"]
    assert tool.update(committed, fresh) == ["updated new/Dockerfile", "removed gone/Dockerfile"]
    assert tool.differences(committed, fresh) == []
