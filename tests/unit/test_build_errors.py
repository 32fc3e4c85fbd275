"""The one line a failed build ends in: envbuild's own explanation from the failed step first."""

from __future__ import annotations

import pytest

from envbuild.docker_engine import _build_error, _push_failure, ipv4_gateway

SCRIPT = "The command '/bin/sh -c missing=\"\";     command -v g++ || missing=g++; ...' returned a non-zero code: 1"  # fmt: skip


def test_a_step_that_explains_itself_is_quoted_not_its_script() -> None:
    lines = [
        "Step 3/14 : RUN missing=...",
        " ---> Running in 0123",
        "envbuild: torch.compile needs g++ libpython3-dev in the image and apt cannot reach the "
        "OS archive (an --offline build?); use a base that has them",
        "W: Some index files failed to download.",
    ]
    assert _build_error(SCRIPT, lines) == (
        "envbuild: torch.compile needs g++ libpython3-dev in the image and apt cannot reach the OS "
        "archive (an --offline build?); use a base that has them (a RUN step exited 1)"
    )


def test_the_installer_explains_itself_too() -> None:
    lines = ["envbuild install: uv could not install /opt/venv/envbuild.lock (exit 2); see its output above"]  # fmt: skip
    assert _build_error(SCRIPT, lines).startswith("envbuild install: uv could not install")


def test_otherwise_the_last_output_goes_with_the_engines_message() -> None:
    lines = ["E: Unable to locate package nosuch", "a", "b", "c"]
    assert _build_error(SCRIPT, lines) == "a RUN step exited 1 (last output: a | b | c)"
    assert _build_error("no space left on device", []) == "no space left on device"


def test_colour_codes_around_envbuilds_line_do_not_hide_it() -> None:
    lines = [
        "\x1b[31merror\x1b[0m: Request failed after 3 retries",
        "\x1b[1m\x1b[31menvbuild install: uv could not download sympy==1.14.0 from the package index "
        "at https://10.0.0.1:8443\x1b[0m",
    ]
    assert _build_error(SCRIPT, lines) == (
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
