"""The shipped knowledge base agrees with what PyPI serves today."""

from __future__ import annotations

import pytest
import requests

from envbuild.knowledge.refresh import PypiClient, refresh
from tests.conftest import REPO


@pytest.mark.live
def test_shipped_torch_knowledge_agrees_with_pypi() -> None:
    with requests.Session() as session:
        result = refresh(
            "torch",
            check=True,
            client=PypiClient(session),
            knowledge_dir=REPO / "matrices" / "knowledge",
        )

    assert not result.changed, "torch.yaml disagrees with PyPI:\n" + "\n".join(result.diff)
