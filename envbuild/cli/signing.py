"""`envbuild keys generate` and `envbuild policy`: the key that signs vetted images, and the
admission policies that let a cluster run only images signed with it.

Registered on the main group by cli; cryptography and YAML are imported inside the commands, so
`envbuild --help` loads neither. The password never comes from an argument: the environment, or
a hidden prompt at a terminal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import click

from envbuild.cli.options import reports_errors


@click.group()
def keys() -> None:
    """Signing keys for `--sign`: ECDSA P-256, the private key encrypted with a password."""


@keys.command("generate")
@click.option(
    "--out",
    required=True,
    type=click.Path(path_type=Path),
    metavar="PATH",
    help="Where the private key goes; the public key goes beside it as PATH without its "
    "suffix, plus .pub.",
)
@click.option("--force", is_flag=True, help="Replace keys already at PATH.")
@reports_errors
def keys_generate(out: Path, force: bool) -> None:
    """Make a signing key pair. The password comes from ENVBUILD_SIGNING_PASSWORD or, at a
    terminal, is asked for twice; it is never an argument."""
    from envbuild.core.errors import BadInput
    from envbuild.publish.keys import PASSWORD_ENV, check_key_paths, generate_key

    check_key_paths(out, force=force)  # before a password is asked for nothing
    password = os.environ.get(PASSWORD_ENV)
    if password is None:
        if not sys.stdin.isatty():
            msg = (
                f"no password for the new key: set {PASSWORD_ENV}, "
                "or run `envbuild keys generate` at a terminal to be asked for one"
            )
            raise BadInput(msg)
        password = click.prompt(
            "Password for the new key", hide_input=True, confirmation_prompt=True, err=True
        )
    public = generate_key(out, password, force=force)
    click.echo(f"private key: {out} (encrypted; keep it secret, sign with {PASSWORD_ENV} set)")
    click.echo(f"public key:  {public} (for `envbuild verify --key`, cosign and `envbuild policy`)")


@click.command()
@click.option(
    "--key",
    "key_file",
    required=True,
    type=click.Path(path_type=Path),
    metavar="PUB",
    help="The public key (the .pub file `envbuild keys generate` wrote).",
)
@click.option(
    "--image",
    "images",
    multiple=True,
    metavar="PATTERN",
    help="Images the policy guards (repeatable), e.g. 'registry.corp/ml/*'. Written as given: "
    "Kyverno matches the whole reference (* crosses /); policy-controller's glob matches the "
    "repository (* within a segment, ** across).",
)
@click.option("--kyverno", is_flag=True, help="Write a Kyverno ClusterPolicy (Kyverno 1.13+).")
@click.option(
    "--policy-controller",
    "policy_controller",
    is_flag=True,
    help="Write sigstore policy-controller ClusterImagePolicies.",
)
@click.option("--name", metavar="NAME", help="The policy's name [default: envbuild-vetted].")
@click.option(
    "-o",
    "--output",
    type=click.Path(path_type=Path),
    metavar="FILE",
    help="Write the YAML here (replaced in one step) instead of standard output.",
)
@reports_errors
def policy(
    key_file: Path,
    images: tuple[str, ...],
    kyverno: bool,
    policy_controller: bool,
    name: str | None,
    output: Path | None,
) -> None:
    """Write an admission policy that lets pods run images under PATTERN only when signed with
    the key, with a signed test-result of PASSED and envbuild's signed provenance (offline: no
    transparency log)."""
    from envbuild.core.errors import BadInput
    from envbuild.core.places import check_output_file

    if output is not None:
        check_output_file(output, "-o")
    if kyverno == policy_controller:
        msg = "choose one kind of policy: --kyverno or --policy-controller"
        raise BadInput(msg)
    from envbuild.publish import policy as policies
    from envbuild.publish.keys import load_public_key, public_pem

    pem = public_pem(load_public_key(key_file)).decode("ascii")
    write = policies.kyverno_policy if kyverno else policies.policy_controller_policy
    text = write(pem, images, name=name or policies.DEFAULT_NAME)
    if output is None:
        click.echo(text, nl=False)
        return
    _write(output, text)
    click.echo(f"wrote {output}", err=True)


def _write(path: Path, text: str) -> None:
    from envbuild.core.atomic import write_atomically
    from envbuild.core.errors import BadInput
    from envbuild.core.names import shown

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomically(path, text, keep_mode=path.exists())
    except OSError as exc:
        msg = f"-o {shown(str(path))}: cannot write it ({exc.strerror}); name a writable file"
        raise BadInput(msg) from None
