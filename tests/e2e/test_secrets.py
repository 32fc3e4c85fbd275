"""Index credentials never leave envbuild: a failing build with debug logging, every output searched."""

from __future__ import annotations

import json
import secrets
import time
from pathlib import Path

import docker
import pytest

from tests.docker_support import envbuild, torch_cpu_args
from tests.fault_support import epoch

pytestmark = pytest.mark.e2e


def test_no_output_of_a_failed_build_holds_the_index_password(
    docker_client: docker.DockerClient,
    torch_cpu_build: object,
    base_image: str,
    wheelhouse: Path,
    ca_bundle: Path,
    tmp_path: Path,
) -> None:
    password = f"Pw-{secrets.token_hex(8)}"
    extra_password = f"Xp-{secrets.token_hex(8)}"
    needles = [password, extra_password]
    report, junit, summary = tmp_path / "r.json", tmp_path / "j.xml", tmp_path / "summary.md"
    args = torch_cpu_args(base_image, wheelhouse, ca_bundle, report)
    index = args.index("--index-url")
    args[index + 1] = f"https://team:{password}@127.0.0.1:9/simple"
    repository = args.index("--repository")
    args[repository + 1] = "envbuild-test/secrets-{framework}"
    # --offline with a wheelhouse that holds torch alone: pip fails at once, the index
    # settings still travel to the engine as build arguments (in the /build request's query).
    args += ["--offline", "--no-smoke", "--junit", str(junit),
             "--extra-index-url", f"https://bot:{extra_password}@127.0.0.1:9/extra"]  # fmt: skip
    started = time.time()
    result = envbuild(
        "-v", *args,
        env={"XDG_CACHE_HOME": str(tmp_path / "cache"), "GITHUB_STEP_SUMMARY": str(summary)},
    )  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "/build?" in result.stderr, "the debug log must show the build request for this test"
    assert "Traceback" not in result.stderr

    outputs: dict[str, str] = {"stdout": result.stdout, "stderr": result.stderr}
    for path in (report, junit, summary, *(tmp_path / "cache").rglob("*")):
        if path.is_file():
            outputs[str(path)] = path.read_text(errors="replace")
    assert json.loads(report.read_text())["results"][0]["status"] == "failed"
    for image in docker_client.images.list(all=True):
        created = image.attrs.get("Created", "")
        if created and epoch(created) >= started - 5:
            outputs[f"image {image.id}"] = json.dumps([image.history(), image.attrs])
    leaked = [(where, n) for where, text in outputs.items() for n in needles if n in text]
    assert leaked == []
    assert len(outputs) >= 5
