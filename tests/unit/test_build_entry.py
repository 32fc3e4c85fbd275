"""build_entry over an in-memory engine: what is built, found, adopted (never), restored, recorded.

Only the engine is a double; the knowledge base, rendering and the result store are real.
"""

from __future__ import annotations

import inspect
import json
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from envbuild.build.entry import build_entry, prepare
from envbuild.core.errors import BadInput, BuildFailed
from envbuild.core.models import (
    AUTO,
    BUILDKIT,
    CLASSIC,
    HASH_LABEL,
    BuildContext,
    BuildOptions,
    Knowledge,
    Lock,
    Selection,
)
from envbuild.core.store import ResultStore
from envbuild.engine.docker_engine import DockerEngine
from envbuild.engine.interface import Engine, choose_builder
from envbuild.plan.matrix import default_matrix_path, load_matrix, make_plan
from tests.support.engine_double import InMemoryEngine

PROTOCOL = sorted(name for name in vars(Engine) if not name.startswith("_"))


@pytest.mark.parametrize("name", PROTOCOL)
@pytest.mark.parametrize("implementation", [DockerEngine, InMemoryEngine])
def test_both_engines_implement_the_protocol_as_declared(implementation: type, name: str) -> None:
    assert inspect.signature(getattr(implementation, name)) == inspect.signature(
        getattr(Engine, name)
    )


def test_the_protocol_covers_what_envbuild_asks_of_an_engine() -> None:
    assert {"build", "run", "image", "tag", "push", "probe_base", "remove_leftovers"} <= set(
        PROTOCOL
    )


def context_for(
    double: InMemoryEngine, knowledge: Knowledge, options: BuildOptions | None = None
) -> BuildContext:
    chosen = Selection(framework="jax", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    if entry.base_image not in double.bases:
        double.add_base(entry.base_image, python=entry.python)
    lock = Lock(
        entry_id=entry.id, text=f"{entry.install.requirement} \\\n    --hash=sha256:{'0' * 64}\n"
    )
    return prepare(double, knowledge, entry, options or BuildOptions(), None, lock)


def test_a_build_is_tagged_labelled_logged_and_recorded(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    built = build_entry(double, context, store=store)

    assert built.built
    record = store.built_image(context.content_hash)
    assert record is not None
    assert (record.image_id, record.entry_id) == (built.id, context.entry.id)
    tagged = double.image(context.entry.image)
    assert tagged is not None
    assert tagged.id == built.id
    assert tagged.labels[HASH_LABEL] == context.content_hash
    assert "org.envbuild.version" in tagged.labels
    (build,) = double.builds
    assert build.dockerfile == context.dockerfile
    assert build.network
    assert not build.no_cache
    assert built.log_path is not None
    assert "Step 1/" in built.log_path.read_text(encoding="utf-8")


def test_the_same_content_hash_is_found_not_rebuilt(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    first = build_entry(double, context, store=store)
    again = build_entry(double, context, store=store)

    assert not again.built
    assert again.id == first.id
    assert again.log_path is None
    assert again.tag_restored_from is None
    assert context.entry.image in again.tags
    assert len(double.builds) == 1


def test_another_engines_build_of_the_same_hash_neither_hides_nor_replaces_this_ones(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, tmp_path: Path
) -> None:
    # One data folder, two engines: the local one built the entry, then a remote one did
    # (an image id the local engine does not have). The local build is still found here.
    context = context_for(double, knowledge)
    first = build_entry(double, context, store=store)
    other = InMemoryEngine(name="remote")
    elsewhere = build_entry(other, context_for(other, knowledge), store=store)
    assert elsewhere.built
    assert elsewhere.id != first.id

    again = build_entry(double, context, store=store)
    assert not again.built
    assert again.id == first.id
    assert len(double.builds) == 1


def test_no_cache_rebuilds_what_exists(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    first = build_entry(double, context, store=store)
    again = build_entry(double, context, store=store, no_cache=True)

    assert again.built
    assert again.id != first.id
    assert double.builds[-1].no_cache
    record = store.built_image(context.content_hash)
    assert record is not None
    assert record.image_id == again.id


def test_a_derived_image_carrying_the_content_hash_is_not_adopted(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    # Built FROM an envbuild image elsewhere and tagged like the entry: the label is inherited.
    derived = double.add_image(
        "derived", tags=(context.entry.image,), labels={HASH_LABEL: context.content_hash}
    )
    built = build_entry(double, context, store=store)

    assert built.built
    assert built.id != derived
    tagged = double.image(context.entry.image)
    assert tagged is not None
    assert tagged.id == built.id


def test_a_moved_tag_is_restored_and_reported(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    ours = build_entry(double, context, store=store).id
    derived = double.add_image(
        "derived", tags=("team/derived:1",), labels={HASH_LABEL: context.content_hash}
    )
    double.tag(derived, context.entry.image)  # `docker tag team/derived:1 <the entry's tag>`

    again = build_entry(double, context, store=store)

    assert not again.built
    assert again.id == ours
    assert again.tag_restored_from == derived
    tagged = double.image(context.entry.image)
    assert tagged is not None
    assert tagged.id == ours
    kept = double.image(derived)
    assert kept is not None
    assert kept.tags == ("team/derived:1",)
    assert len(double.builds) == 1


def test_an_image_the_engine_no_longer_has_is_rebuilt(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    first = build_entry(double, context, store=store)
    double.remove_image(first.id)  # `docker rmi`, or a pruned engine

    again = build_entry(double, context, store=store)

    assert again.built
    assert again.id != first.id
    record = store.built_image(context.content_hash)
    assert record is not None
    assert record.image_id == again.id


def test_a_failed_build_names_the_entry_and_its_log_and_records_nothing(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    double.failing_builds[context.entry.image] = "No matching distribution found for jax"
    with pytest.raises(BuildFailed) as failed:
        build_entry(double, context, store=store)

    message = failed.value.message
    assert message.startswith(f"{context.entry.id}: build failed: No matching distribution")
    log = Path(message.split(" (full log: ", 1)[1].removesuffix(")"))
    assert log.name == f"{context.entry.id}.log"
    assert "ERROR: No matching distribution found for jax" in log.read_text(encoding="utf-8")
    assert store.built_image(context.content_hash) is None


def fetch(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        return bytes(response.read())


@pytest.mark.parametrize("fails", [False, True], ids=["built", "failed"])
def test_secrets_are_served_during_the_build_and_never_a_build_argument(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, tmp_path: Path, fails: bool
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nteam CA\n")
    options = BuildOptions(index_url="https://ci:hunter2-pw@mirror.example/simple", ca_bundle=ca)
    context = context_for(double, knowledge, options)
    fetched: dict[str, bytes] = {}

    def install(build_args: dict[str, str]) -> None:  # what the image's install RUN fetches
        for name in ("config.json", "ca.crt"):
            fetched[name] = fetch(build_args["ENVBUILD_SERVE"] + name)

    double.during_build = install
    if fails:
        double.failing_builds[context.entry.image] = "network unreachable"
        with pytest.raises(BuildFailed):
            build_entry(double, context, store=store)
    else:
        build_entry(double, context, store=store)
    (build,) = double.builds
    assert list(build.build_args) == ["ENVBUILD_SERVE"]
    url = build.build_args["ENVBUILD_SERVE"]
    assert url.startswith("http://127.0.0.1:")
    assert "hunter2-pw" not in url
    assert json.loads(fetched["config.json"])["index_url"] == options.index_url
    assert fetched["ca.crt"] == ca.read_bytes()
    assert sorted(build.files) == ["Dockerfile", "envbuild.lock", "install_env.py"]
    with pytest.raises(urllib.error.URLError):  # the URL the history keeps grants nothing
        fetch(url + "config.json")


def test_an_offline_build_has_no_network_and_is_served_no_index(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, tmp_path: Path
) -> None:
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "jax-0.10.2-py3-none-any.whl").write_bytes(b"w")
    (wheels / "jaxlib-0.10.2-cp311-cp311-manylinux_2_27_x86_64.whl").write_bytes(b"w")
    options = BuildOptions(wheelhouse=wheels, offline=True, index_url="https://u:pw@m.example/s")
    context = context_for(double, knowledge, options)
    fetched: dict[str, bytes] = {}

    def install(build_args: dict[str, str]) -> None:
        fetched["config"] = fetch(build_args["ENVBUILD_SERVE"] + "config.json")
        fetched["listing"] = fetch(build_args["ENVBUILD_SERVE"] + "wheels/")

    double.during_build = install
    build_entry(double, context, store=store)
    (build,) = double.builds
    assert not build.network
    config = json.loads(fetched["config"])
    assert (config["offline"], config["index_url"], config["extra_index_urls"]) == (True, None, [])
    assert b"jaxlib-0.10.2-cp311" in fetched["listing"]


def test_a_record_naming_an_image_without_the_content_hash_is_not_trusted(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore
) -> None:
    context = context_for(double, knowledge)
    other = double.add_image("unrelated", tags=("team/other:1",))
    # A record copied from another host, or one whose id now names something else.
    store.record_built(context.content_hash, context.entry.id, context.entry.image, other)

    built = build_entry(double, context, store=store)

    assert built.built
    assert built.id != other
    tagged = double.image(context.entry.image)
    assert tagged is not None
    assert tagged.id == built.id


def test_with_buildkit_the_secrets_are_secret_files_and_uv_and_the_wheels_are_in_the_context(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\nteam CA\n")
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "jax-0.10.2-py3-none-any.whl").write_bytes(b"w")
    (wheels / "flax-0.1-py3-none-any.whl").write_bytes(b"not in the lock")
    options = BuildOptions(
        index_url="https://ci:hunter3-pw@mirror.example/simple", ca_bundle=ca, wheelhouse=wheels,
        builder=BUILDKIT,
    )  # fmt: skip
    context = context_for(double, knowledge, options)
    build_entry(double, context, store=store)

    (build,) = double.builds
    assert build.builder == BUILDKIT
    assert build.build_args == {}  # nothing served: no URL in the history
    config = json.loads(build.secrets["envbuild-config"])
    assert config["index_url"] == options.index_url
    assert build.secrets["envbuild-ca"] == ca.read_bytes()
    assert "envbuild-inputs/uv" in build.files
    assert "envbuild-inputs/wheels/jax-0.10.2-py3-none-any.whl" in build.files
    assert "envbuild-inputs/wheels/flax-0.1-py3-none-any.whl" not in build.files
    assert not [f for f in build.files if "config" in f or f.endswith(("ca.crt", ".pem"))]
    assert "hunter3-pw" not in build.dockerfile
    assert "--mount=type=secret,id=envbuild-config" in build.dockerfile
    assert "ARG ENVBUILD_SERVE" not in build.dockerfile
    assert not list(tmp_path.glob("**/config.json"))  # the secret files left with the build


def test_a_ca_bundle_over_buildkits_secret_limit_is_bound_from_the_context(
    double: InMemoryEngine, knowledge: Knowledge, store: ResultStore, tmp_path: Path
) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_bytes(b"-----BEGIN CERTIFICATE-----\n" + b"A" * (600 * 1024))
    options = BuildOptions(ca_bundle=ca, builder=BUILDKIT)
    build_entry(double, context_for(double, knowledge, options), store=store)
    (build,) = double.builds
    assert "envbuild-ca" not in build.secrets
    assert "envbuild-inputs/ca.crt" in build.files


def test_an_offline_build_from_a_base_without_python_is_refused_before_it_starts(
    double: InMemoryEngine, knowledge: Knowledge
) -> None:
    chosen = Selection(framework="jax", cuda="cpu")
    (entry,) = make_plan(knowledge, load_matrix(default_matrix_path(), knowledge), chosen).entries
    double.add_base(entry.base_image, python=None)
    lock = Lock(entry_id=entry.id, text="jax==0.10.2 \\\n    --hash=sha256:" + "0" * 64 + "\n")
    with pytest.raises(BadInput, match=r"--offline: base image .* has no python3"):
        prepare(double, knowledge, entry, BuildOptions(offline=True), None, lock)
    assert double.builds == []


@pytest.mark.parametrize(
    ("support", "wanted", "chosen"),
    [
        ({BUILDKIT: "", CLASSIC: ""}, AUTO, CLASSIC),
        ({BUILDKIT: "no client", CLASSIC: ""}, AUTO, CLASSIC),
        ({BUILDKIT: "", CLASSIC: "remote"}, AUTO, BUILDKIT),
        ({BUILDKIT: "", CLASSIC: ""}, BUILDKIT, BUILDKIT),
    ],
)
def test_the_builder_is_the_one_asked_for_or_classic_on_this_host_else_buildkit(
    support: dict[str, str], wanted: str, chosen: str
) -> None:
    assert choose_builder(InMemoryEngine(support=support), wanted) == chosen


@pytest.mark.parametrize("wanted", [AUTO, CLASSIC, BUILDKIT])
def test_a_builder_that_cannot_work_is_one_line_naming_why(wanted: str) -> None:
    engine = InMemoryEngine(support={BUILDKIT: "no client here", CLASSIC: "it is rootless"})
    with pytest.raises(BadInput) as refused:
        choose_builder(engine, wanted)
    assert "\n" not in refused.value.message
    assert ("no client here" in refused.value.message) == (wanted != CLASSIC)
    assert ("it is rootless" in refused.value.message) == (wanted != BUILDKIT)
