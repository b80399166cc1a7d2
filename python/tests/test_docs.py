"""The documentation: every relative link and anchor resolves, every code block a user
would paste is either run here (on the fixtures) or marked with why it cannot be, and the
README stays short."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, run_cli

PAGES = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
# Blocks a user pastes; `text` blocks (synopses, outputs) and unlabelled ones are not.
PASTED = ("sh", "bash", "python", "rust")
MARKER = re.compile(r"^<!-- doc-test: (run|skip: .+) -->$")


def blocks(page: Path) -> list[tuple[int, str, str, str | None]]:
    """Each fenced block: (line, language, code, the doc-test marker after it or None)."""
    lines = page.read_text().split("\n")
    found, start = [], None
    for i, line in enumerate(lines):
        if not line.startswith("```"):
            continue
        if start is None:
            start = i
            continue
        following = lines[i + 1] if i + 1 < len(lines) else ""
        marker = MARKER.match(following)
        found.append((start + 1, lines[start][3:].strip(), "\n".join(lines[start + 1:i]),
                      marker.group(1) if marker else None))
        start = None
    return found


def slug(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower().replace("`", ""))
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fenced = set(), False
    for line in page.read_text().split("\n"):
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(r"^#{1,6} ", line):
            out.add(slug(line.lstrip("#")))
    return out


def test_every_relative_link_and_anchor_resolves():
    checked = 0
    for page in PAGES:
        text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
                continue
            path, _, anchor = target.partition("#")
            file = (page.parent / path).resolve() if path else page
            assert file.exists(), f"{page.name}: link to missing {target}"
            if anchor:
                assert anchor in anchors(file), f"{page.name}: no heading #{anchor} in {path}"
            checked += 1
    assert checked >= 15


def test_every_pasted_block_is_run_or_says_why_not():
    unmarked = [f"{page.relative_to(REPO)}:{line}" for page in PAGES
                for line, language, _, marker in blocks(page)
                if language in PASTED and marker is None]
    assert unmarked == [], "code blocks without a <!-- doc-test: run|skip: why --> marker"
    runnable = [b for page in PAGES for b in blocks(page) if b[3] == "run"]
    assert len(runnable) >= 3


def test_the_readme_is_short():
    assert len((REPO / "README.md").read_text().split("\n")) <= 250


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_runnable_blocks_run(page, tmp_path, torch):
    """The page's `run` blocks in order, from the repository root, with /tmp/ moved to a
    scratch directory and the installed console script and interpreter on PATH; the
    README's set-up output (/tmp/shardify-demo) made first, through the console script."""
    runnable = [(line, language, code) for line, language, code, marker in blocks(page)
                if marker == "run"]
    if not runnable:
        pytest.skip(f"{page.name} has no runnable block")
    run_cli("convert", str(REPO / "fixtures" / "kaggle-mini"), str(tmp_path / "shardify-demo"),
            "--split", "train", "--seed", "42")
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    for line, language, code in runnable:
        code = code.replace("/tmp/", f"{tmp_path}/")
        if language == "python":
            command = [sys.executable, "-c", code]
        else:
            assert language in ("sh", "bash"), f"{page.name}:{line}: cannot run {language}"
            command = ["bash", "-euo", "pipefail", "-c", code]
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True,
                              timeout=300)
        assert done.returncode == 0, (f"{page.name}:{line} failed:\n{code}\n"
                                      f"{done.stdout}\n{done.stderr}")
