"""The README's commands are the ones CI and users run."""

from conftest import REPO

TEST_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[test]' && .venv/bin/python -m pytest"
BUILD_COMMAND = "python3 -m venv .venv && .venv/bin/pip install -e '.[all]' && .venv/bin/doit"


def test_ci_runs_the_readme_test_command():
    readme = (REPO / "README.md").read_text()
    assert TEST_COMMAND in readme and BUILD_COMMAND in readme
    assert (REPO / ".ci" / "run").read_text().strip().endswith(TEST_COMMAND)
