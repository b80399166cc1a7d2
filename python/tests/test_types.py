"""Types: the stubs of the native module agree with it (stubtest), the package passes
``mypy --strict`` and the examples plain ``mypy``."""

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import IN_CI, REPO


class Check:
    """``python -m ARGS`` (mypy or its stubtest) with the project's configuration, started
    in ``work``, its output in ``work/output``."""

    def __init__(self, work: Path, *args: str):
        if not IN_CI:
            pytest.importorskip("mypy", reason="mypy is not installed")
        work.mkdir(parents=True, exist_ok=True)
        if args[0] == "mypy.stubtest":
            options = ["--mypy-config-file", str(stubtest_config(work))]
        else:
            options = ["--cache-dir", str(work / "cache"), "--config-file",
                       str(REPO / "pyproject.toml")]
        self.output = work / "output"
        with open(self.output, "w") as output:
            self.process = subprocess.Popen([sys.executable, "-m", *args, *options],
                                            stdout=output, stderr=subprocess.STDOUT, cwd=work)

    def passed(self) -> str:
        """Its output, once it has exited, which it must have done with 0."""
        returncode = self.process.wait(timeout=600)
        output = self.output.read_text()
        assert returncode == 0, output
        return output


def stubtest_config(work: Path) -> Path:
    """The project's configuration, following no import but stubs: stubtest builds the
    native module's stubs with their package's ``__init__`` and all that it imports (torch,
    numpy: 30 s of the suite), none of which the stubs use. They import the standard
    library alone, whose typeshed stubs are followed still (mypy follows ``.pyi`` files
    whatever ``follow_imports`` says); a stub's wrong name, parameter or missing method is
    reported the same (tried on each)."""
    table = "[tool.mypy]\n"
    project = (REPO / "pyproject.toml").read_text()
    assert table in project
    config = work / "pyproject.toml"
    config.write_text(project.replace(table, table + 'follow_imports = "skip"\n'))
    return config


@pytest.fixture(scope="module")
def mypy_runs(tmp_path_factory) -> Iterator[dict[str, Check]]:
    """``mypy --strict`` over the package and plain mypy over the examples, started
    together: each is one process that analyses torch's code for about 20 s, and one after
    the other they left one of a 2-core machine's cores idle. A check whose test is not
    selected is stopped at the end."""
    work = tmp_path_factory.mktemp("mypy")
    examples = sorted(str(p) for p in (REPO / "examples").glob("*.py"))
    assert len(examples) >= 4
    runs = {"package": Check(work / "package", "mypy", "--strict", "-p", "shardify"),
            "examples": Check(work / "examples", "mypy", *examples)}
    yield runs
    for run in runs.values():
        run.process.kill()
        run.process.wait()


def test_native_stubs_match_the_module(tmp_path):
    # The installed package: stubs and compiled module side by side, as users get them.
    # The native module alone: stubtest of the pure-Python modules compares each with
    # itself, and under the configuration's Python 3.10 it finds on Python 3.13 that
    # every dataclass lacks the __replace__ which 3.13 adds.
    assert "Success" in Check(tmp_path, "mypy.stubtest", "shardify._native").passed()


def test_package_is_strictly_typed(mypy_runs):
    assert "Success" in mypy_runs["package"].passed()


def test_examples_type_check(mypy_runs):
    assert "Success" in mypy_runs["examples"].passed()
