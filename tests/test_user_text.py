"""User-facing files speak of the product: no internal references, no stale promises."""

from __future__ import annotations

import re

import pytest
from harness import ROOT

USER_FACING = ["README.md", "Dockerfile", "docs", "configs", "launch", "examples", "lab"]
INTERNAL = re.compile(
    r"\bissue\s*#?\d+|\bthe issue\b|\bbeing added\b|\bseed (notes|experiments)\b|\bseed's\b"
    r"|\bengineers?'?\b|\bfounding notes\b|\bthe lead\b|\bTODO\b|\bFIXME\b",
    re.IGNORECASE,
)


def user_files() -> list:
    files = []
    for name in USER_FACING:
        path = ROOT / name
        found = [path] if path.is_file() else sorted(p for p in path.rglob("*") if p.is_file())
        files += [p for p in found if p.suffix in ("", ".md", ".yaml", ".yml", ".py", ".sh")]
    return files


@pytest.mark.parametrize("path", user_files(), ids=lambda p: str(p.relative_to(ROOT)))
def test_no_internal_references(path) -> None:
    text = " ".join(path.read_text(encoding="utf-8").split())  # phrases broken across lines
    found = [m.group(0) for m in INTERNAL.finditer(text)]
    assert found == [], f"{path.relative_to(ROOT)}: {found}"


@pytest.mark.parametrize(
    "path", sorted((ROOT / "launch" / "k8s").glob("*.yaml")), ids=lambda p: p.name
)
def test_every_manifest_opens_with_its_kubectl_command(path) -> None:
    first = path.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# kubectl apply -f ") and f"launch/k8s/{path.name}" in first, first
