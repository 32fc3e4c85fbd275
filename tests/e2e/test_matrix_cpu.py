"""A three-entry CPU matrix (torch, TensorFlow, JAX) built two at a time, with JUnit and a summary.

TensorFlow and JAX come from PyPI through the CA bundle; each image must train (falling loss) and
all-reduce over 2 devices inside its own container.
"""

from __future__ import annotations

import json
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import docker
import pytest

from tests.support.docker_support import CpuMatrix

pytestmark = pytest.mark.e2e


def apt_step_cached(log: str) -> bool:
    """Whether the build log says the OS + Python stage's apt step came from the cache: the
    classic builder's `Using cache` before its next step, BuildKit's `#N CACHED` for that step."""
    if "Step 1/" in log:
        return "Using cache" in log.split("apt-get install", 1)[1].split("Step 3/", 1)[0]
    step = re.search(r"^#(\d+) \[runtime \d+/\d+\] RUN apt-get", log, re.MULTILINE)
    return step is not None and re.search(rf"^#{step[1]} CACHED$", log, re.MULTILINE) is not None


def test_three_entries_two_at_a_time(cpu_matrix: CpuMatrix) -> None:
    result, report, junit, summary = (
        cpu_matrix.result,
        cpu_matrix.report,
        cpu_matrix.junit,
        cpu_matrix.summary,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    assert "shared OS + Python stage" in result.stderr
    results = {r["entry"]["framework"]: r for r in json.loads(report.read_text())["results"]}
    assert set(results) == {"torch", "tensorflow", "jax"}
    for framework, entry in results.items():
        smoke = entry["smoke"]
        assert smoke["passed"] is True, (framework, smoke["checks"])
        assert smoke["payload"] == framework
        assert smoke["train"]["loss_last"] < smoke["train"]["loss_first"]
        assert (smoke["allreduce"]["world_size"], smoke["allreduce"]["correct"]) == (2, True)
        assert smoke["allreduce"]["got"] == smoke["allreduce"]["expected"] == 3.0
        assert smoke["versions"]["framework"].startswith(entry["entry"]["framework_version"])
        # What training really does, in every framework: a compiled step, an input pipeline, a
        # checkpoint restored mid-run, numpy, and every package of the lock importing.
        checks = {c["name"]: c["passed"] for c in smoke["checks"]}
        for name in ("compiled_step", "data_loader", "checkpoint_resumed", "numpy_interop", "packages_import"):  # fmt: skip
            assert checks.get(name) is True, (framework, name, smoke["checks"])
        assert smoke["compile"]["loss_last"] < smoke["compile"]["loss_first"], framework
        assert smoke["checkpoint"]["loss_after_resume"] == pytest.approx(
            smoke["checkpoint"]["loss_uninterrupted"], rel=1e-3
        ), framework
        assert smoke["packages"]["imported"] >= smoke["packages"]["distributions"] > 0, framework
        assert smoke["packages"]["failures"] == [], framework
        if entry["status"] == "built":
            # The OS + Python stage was built once up front: every entry that built it (in its
            # framework image) found it in the cache. An entry whose framework image another
            # lane's test had built (the lanes share a store) built no OS stage at all.
            log = Path(entry["image"]["log"]).read_text()
            if "built before on this engine" not in log.split("\n", 1)[0]:
                assert apt_step_cached(log), (framework, log[:3000])
            else:
                assert "apt-get install" not in log, (framework, log[:3000])
    assert results["tensorflow"]["status"] == results["jax"]["status"] == "built"
    assert results["tensorflow"]["entry"]["framework_version"].startswith("2.20.")

    suite = ET.parse(junit).getroot()
    assert (suite.get("tests"), suite.get("failures")) == ("3", "0")
    assert sorted(c.get("name") or "" for c in suite.iter("testcase")) == sorted(
        r["entry"]["id"] for r in results.values()
    )
    text = summary.read_text()
    assert "3/3 entries passed" in text
    assert text.count("✅ passed") == 3


def test_images_run_as_envbuild_unless_the_matrix_chose_root(
    cpu_matrix: CpuMatrix, docker_client: docker.DockerClient
) -> None:
    # The fixture's matrix gives its JAX include `user: root`; the others keep the default.
    results = {
        r["entry"]["framework"]: r for r in json.loads(cpu_matrix.report.read_text())["results"]
    }
    expected = {"torch": "envbuild", "tensorflow": "envbuild", "jax": "root"}
    assert {f: r["entry"]["user"] for f, r in results.items()} == expected
    for framework, result in results.items():
        spec = "0:0" if expected[framework] == "root" else "1000:1000"
        image = docker_client.images.get(result["image"]["id"])
        assert image.attrs["Config"]["User"] == spec, framework
        assert image.labels["org.envbuild.user"] == spec, framework
        user = result["smoke"]["user"]
        assert (f"{user['uid']}:{user['gid']}", user["name"]) == (spec, expected[framework])
        checks = {c["name"]: c for c in result["smoke"]["checks"]}
        assert checks["user"]["passed"] is True, (framework, checks["user"])
