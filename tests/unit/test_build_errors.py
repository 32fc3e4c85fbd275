"""The one line a failed build ends in: envbuild's own explanation from the failed step first."""

from __future__ import annotations

import socket
import subprocess
from datetime import UTC, datetime

import pytest

from envbuild.core.interrupt import run_alive, run_id, run_place
from envbuild.engine.build_errors import build_error
from envbuild.engine.docker_engine import _push_failure, ipv4_gateway
from envbuild.engine.leftovers import LIVE_RUN_GRACE_S, build_server_answers, left_behind

SCRIPT = "The command '/bin/sh -c missing=\"\";     command -v g++ || missing=g++; ...' returned a non-zero code: 1"  # fmt: skip


def test_a_step_that_explains_itself_is_quoted_not_its_script() -> None:
    lines = [
        "Step 3/14 : RUN missing=...",
        " ---> Running in 0123",
        "envbuild: torch.compile needs g++ libpython3-dev in the image and apt cannot reach the "
        "OS archive (an --offline build?); use a base that has them",
        "W: Some index files failed to download.",
    ]
    assert build_error(SCRIPT, lines) == (
        "envbuild: torch.compile needs g++ libpython3-dev in the image and apt cannot reach the OS "
        "archive (an --offline build?); use a base that has them (a RUN step exited 1)"
    )


def test_the_installer_explains_itself_too() -> None:
    lines = ["envbuild install: uv could not install /opt/venv/envbuild.lock (exit 2); see its output above"]  # fmt: skip
    assert build_error(SCRIPT, lines).startswith("envbuild install: uv could not install")


def test_otherwise_the_last_output_goes_with_the_engines_message() -> None:
    lines = ["E: Unable to locate package nosuch", "a", "b", "c"]
    assert build_error(SCRIPT, lines) == "a RUN step exited 1 (last output: a | b | c)"
    assert build_error("unexpected EOF", []) == "unexpected EOF"


def test_colour_codes_around_envbuilds_line_do_not_hide_it() -> None:
    lines = [
        "\x1b[31merror\x1b[0m: Request failed after 3 retries",
        "\x1b[1m\x1b[31menvbuild install: uv could not download sympy==1.14.0 from the package index "
        "at https://10.0.0.1:8443\x1b[0m",
    ]
    assert build_error(SCRIPT, lines) == (
        "envbuild install: uv could not download sympy==1.14.0 from the package index at "
        "https://10.0.0.1:8443 (a RUN step exited 1)"
    )


def test_a_push_the_engine_cannot_trust_names_where_docker_reads_the_ca() -> None:
    ref = "registry.corp.example:5000/team/torch:2.4"
    error = (
        'Get "https://registry.corp.example:5000/v2/": tls: failed to verify certificate: '
        "x509: certificate signed by unknown authority"
    )
    (line,) = _push_failure(ref, error).splitlines()
    assert line.startswith(f"push of {ref} failed: ")
    assert error in line
    assert "/etc/docker/certs.d/registry.corp.example:5000/ca.crt" in line


def test_other_push_failures_are_left_as_the_engine_said() -> None:
    ref = "registry.corp.example:5000/team/torch:2.4"
    error = "denied: requested access to the resource is denied"
    assert _push_failure(ref, error) == f"push of {ref} failed: {error}"


@pytest.mark.parametrize(
    ("config", "gateway"),
    [
        ([{"Subnet": "172.17.0.0/16", "Gateway": "172.17.0.1"}], "172.17.0.1"),
        # An engine that adopted docker0 from an earlier dockerd lists only the subnet.
        ([{"Subnet": "172.17.0.0/16"}], "172.17.0.1"),
        ([{"Subnet": "fd00::/64"}, {"Subnet": "10.9.0.0/24"}], "10.9.0.1"),
        ([{"Subnet": "fd00::/64", "Gateway": "fd00::1"}], None),
        ([{"Subnet": "not a subnet"}], None),
        ([{"Subnet": "10.0.0.1/32"}], None),
        ([], None),
        (None, None),
    ],
)
def test_the_gateway_of_a_network_is_read_or_derived_from_its_subnet(
    config: object, gateway: str | None
) -> None:
    assert ipv4_gateway({"IPAM": {"Config": config}}) == gateway


NOW = 1_800_000_000.0


def stamp(seconds_ago: float) -> str:
    """The engine's time stamp (nanoseconds, Z) of `seconds_ago` before NOW."""
    moment = datetime.fromtimestamp(NOW - seconds_ago, UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%S.123456789Z")


SMOKE = {"org.envbuild.role": "smoke", "org.envbuild.run": "4242-ab12cd34", "org.envbuild.run.place": "boot/1"}  # fmt: skip
INSTALL = {"org.envbuild.stage": "install"}


def exited(code: int, seconds_ago: float = 1, **more: object) -> dict[str, object]:
    return {"Status": "exited", "ExitCode": code, "FinishedAt": stamp(seconds_ago), **more}


@pytest.mark.parametrize(
    ("state", "labels", "run", "left"),
    [
        # Killed when the engine came back, or lost with the machine.
        (exited(137), INSTALL, None, True),
        (exited(255), SMOKE, True, True),
        ({"Status": "dead", "ExitCode": 0, "FinishedAt": stamp(1)}, SMOKE, True, True),
        # The install step failed: its builder never commits it (and removes it too).
        (exited(1), INSTALL, None, True),
        # The install step just ended well: a live builder is committing it.
        (exited(0), INSTALL, None, False),
        # A smoke container whose run is dead (here: same kernel and pid namespace).
        (exited(0), SMOKE, False, True),
        # ... whose run still reads its output, or whose run this process cannot see.
        (exited(0), SMOKE, True, False),
        (exited(1, 30), SMOKE, None, False),
        # Killed for memory: its run reads why.
        (exited(137, OOMKilled=True), SMOKE, True, False),
        # Ended long ago: its run died, wherever it ran.
        (exited(0, LIVE_RUN_GRACE_S + 1), INSTALL, None, True),
        (exited(0, LIVE_RUN_GRACE_S + 1), SMOKE, None, True),
        ({"Status": "exited", "ExitCode": 0, "FinishedAt": "0001-01-01T00:00:00Z"}, SMOKE, None, False),
        ({"Status": "exited", "ExitCode": 0, "FinishedAt": "not a time"}, SMOKE, None, False),
        ("exited", SMOKE, False, False),  # the list endpoint's bare state: not enough to judge
        (None, SMOKE, False, False),
        ({"Status": "running", "ExitCode": 0}, SMOKE, False, False),
    ],
)  # fmt: skip
def test_only_what_a_dead_run_left_is_a_leftover(
    state: object, labels: dict[str, str], run: bool | None, left: bool
) -> None:
    asked: list[tuple[str, str]] = []

    def alive(run_id: str, place: str) -> bool | None:
        asked.append((run_id, place))
        return run

    attrs = {"State": state, "Created": stamp(900), "Config": {"Labels": labels}}
    assert left_behind(attrs, now=NOW, alive=alive) is left
    assert set(asked) <= {("4242-ab12cd34", "boot/1")}


@pytest.mark.parametrize(("created_ago", "left"), [(10, False), (300, True)])
def test_a_container_never_started_is_left_once_no_run_can_be_about_to_start_it(
    created_ago: float, left: bool
) -> None:
    attrs = {"State": {"Status": "created", "ExitCode": 0}, "Created": stamp(created_ago)}
    assert left_behind(attrs, now=NOW, alive=lambda run, place: None) is left


def test_a_run_is_alive_while_its_process_runs_and_only_where_its_pid_means_it() -> None:
    here = run_place()
    assert here  # Linux: the boot id and the pid namespace are readable
    assert run_alive(run_id(), here) is True
    dead = f"{_reaped_pid()}-00000000"  # its pid names no process now
    assert run_alive(dead, here) is False
    assert run_alive(run_id(), "another-boot/1") is None  # another host or container
    assert run_alive(run_id(), "") is None
    assert run_alive("not-a-run", here) is None
    assert run_alive(f"{10**30}-ab", here) is None


def _reaped_pid() -> int:
    process = subprocess.Popen(["true"])
    process.wait()
    return process.pid


@pytest.mark.parametrize(("serving", "left"), [(False, True), (True, False), (None, False)])
def test_an_install_step_that_ended_well_is_left_once_its_runs_build_server_is_gone(
    serving: bool | None, left: bool
) -> None:
    """The shim lets an install step finish after its engine died; its build is over when the
    build server its run gave it (ENVBUILD_SERVE) refuses connections."""
    url = "http://172.17.0.1:53123/token/"
    asked: list[str] = []

    def answers(served: str) -> bool | None:
        asked.append(served)
        return serving

    attrs = {
        "State": exited(0),
        "Created": stamp(60),
        "Config": {"Labels": INSTALL, "Env": ["PATH=/usr/bin", f"ENVBUILD_SERVE={url}"]},
    }
    assert left_behind(attrs, now=NOW, alive=lambda run, place: None, serving=answers) is left
    assert asked == [url]


def test_a_build_server_that_refuses_is_gone_and_one_that_listens_answers() -> None:
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        assert build_server_answers(f"http://127.0.0.1:{port}/t/") is True
    assert build_server_answers(f"http://127.0.0.1:{port}/t/") is False  # closed: refused
    assert build_server_answers("http://127.0.0.1/t/") is None  # no port: cannot tell
    assert build_server_answers("http://[::1/t/") is None


@pytest.mark.parametrize(
    "env",
    [
        None,
        "ENVBUILD_SERVE=http://127.0.0.1:1/t/",  # a string, not the engine's list
        [{"ENVBUILD_SERVE": "x"}, 7, None],
        ["ENVBUILD_SERVE"],  # no value
        ["ENVBUILD_SERVE=http://127.0.0.1:99999/t/"],  # no such port
        ["ENVBUILD_SERVE=" + "h" * 100_000],
        ["ENVBUILD_SERVE=\udcff\x00://[::1"],
    ],
)
def test_a_hostile_environment_in_the_engines_answer_keeps_the_install_step(env: object) -> None:
    """What the engine says of a container is not trusted: an environment that names no build
    server this host can judge leaves the install step to the 10-minute rule."""
    attrs = {"State": exited(0), "Config": {"Labels": INSTALL, "Env": env}}
    assert left_behind(attrs, now=NOW, alive=lambda run, place: None) is False


@pytest.mark.parametrize(
    ("message", "lines", "where"),
    [
        # The classic builder, committing a step's layer (seen in CI with the CUDA build).
        ("Error processing tar file(exit status 1): write /opt/venv/lib/python3.11/site-packages/"
         "nvidia/cudnn/lib/libcudnn.so.9: no space left on device", ["envbuild install: inputs 0.0 s"],
         " writing /opt/venv/lib/python3.11/site-packages/nvidia/cudnn/lib/libcudnn.so.9"),
        # uv inside the step, before envbuild's own line about it (also seen in CI).
        (SCRIPT, ["error: Failed to download `torch==2.13.0+cpu`",
                  "  cause: failed to write to file `/tmp/envbuild-install-x/torch/lib/libtorch_cpu.so`: "
                  "No space left on device (os error 28)",
                  "envbuild install: uv could not install /tmp/envbuild/framework.lock (exit 1)"],
         " writing /tmp/envbuild-install-x/torch/lib/libtorch_cpu.so"),
        ("failed to copy files: no space left on device", [], ""),
    ],
)  # fmt: skip
def test_a_full_disk_is_named_as_the_cause_with_the_fix(
    message: str, lines: list[str], where: str
) -> None:
    line = build_error(message, lines)
    assert line == (
        f"the build ran out of disk space{where}; free space where the engine keeps its data "
        "(`docker system df` shows what uses it; `docker image prune` and `docker builder prune` "
        "free it) and build again"
    )
