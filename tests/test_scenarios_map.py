"""tests/README.md, the map from each scenario to the test that proves it, is what
tests/scenarios.py makes of the test files now."""

from __future__ import annotations

import contextlib
import io
import pathlib

import scenarios

HERE = pathlib.Path(__file__).resolve().parent


def test_the_committed_map_is_the_generated_one() -> None:
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        scenarios.main()
    committed = (HERE / "README.md").read_text()
    assert (
        committed == out.getvalue()
    ), "tests/README.md is stale: run `.venv/bin/python tests/scenarios.py > tests/README.md`"
