"""The options commands share, checked: selectors, fetch options, the fleet; and the wrapper
that turns EnvbuildError into one line and an exit code.

Like cli, this module imports heavy modules only inside functions, so `envbuild --help` starts fast.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from envbuild.core.errors import BadInput, EnvbuildError, SelectionError

if TYPE_CHECKING:
    from envbuild.core.models import Fleet, Knowledge, Plan, Selection
    from envbuild.plan.matrix_file import Matrix
    from envbuild.publish.keys import SigningKey

F = TypeVar("F", bound=Callable[..., Any])


def _fail(message: str, code: int) -> None:
    from envbuild.core.redact import redact

    for line in redact(message).splitlines():
        click.echo(f"envbuild: error: {line}", err=True)
    sys.exit(code)


def reports_errors(func: F) -> F:
    """Turn EnvbuildError into its message on stderr and its exit code; never a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except EnvbuildError as exc:
            _fail(exc.message, exc.exit_code)
        except KeyboardInterrupt as exc:
            from envbuild.core.interrupt import exit_code, remove_scratch

            remove_scratch()
            code = exit_code(exc)
            click.echo(
                f"envbuild: error: {'terminated' if code == 143 else 'interrupted'}", err=True
            )
            sys.stdout.flush()
            sys.stderr.flush()
            # Not sys.exit: it would wait for worker threads still blocked on the engine.
            os._exit(code)
        return None

    return wrapper  # type: ignore[return-value]


# The options of `selectors` that pick entries (the rest say how they are named).
SELECTOR_KEYS = ("framework", "framework_version", "cuda", "python", "os_name", "matrix_file")


def picked(kwargs: dict[str, Any]) -> bool:
    """Whether the command line picked entries with selectors (not only named a repository)."""
    return any(kwargs[key] for key in SELECTOR_KEYS)


def gpus_option(help_text: str) -> Callable[[F], F]:
    """`--gpus auto|all|none`: which GPUs the containers of a command get."""
    from envbuild.core.models import GPU_CHOICES

    return click.option(
        "--gpus", type=click.Choice(GPU_CHOICES), default="auto", show_default=True, help=help_text
    )


def selectors(func: F) -> F:
    """The options every entry-picking command shares."""
    options = [
        click.option(
            "--repository",
            metavar="REPO",
            help=(
                "Image repository [HOST[:PORT]/]path, lowercase; may use the placeholder "
                "{framework} [default: the matrix's, envbuild/{framework}]."
            ),
        ),
        click.option(
            "-m",
            "--matrix",
            "matrix_file",
            type=click.Path(path_type=Path),
            help="Matrix file (default: every release in the knowledge base).",
        ),
        click.option("--os", "os_name", metavar="OS", help="OS base, e.g. bookworm."),
        click.option(
            "--platform",
            metavar="OS/ARCH[,...]",
            help="linux/amd64, linux/arm64, or both comma-separated (default: this host's).",
        ),
        click.option("--python", metavar="X.Y", help="Python version, e.g. 3.11."),
        click.option(
            "--cuda",
            metavar="VER",
            help="'cpu', a major ('12': every 12.x), '12.1', or a wheel tag ('cu121', 'cu12').",
        ),
        click.option(
            "--framework-version", metavar="PREFIX", help="Release or prefix: '2.1' matches 2.1.x."
        ),
        click.option("--framework", metavar="NAME", help="Framework, e.g. torch."),
    ]
    for option in options:
        func = option(func)
    return func


_SELECTOR_EXAMPLES = {
    "framework": "torch",
    "framework_version": "2.4 or 2.4.1",
    "python": "3.11",
    "os_name": "bookworm",
}


def selection_from(kwargs: dict[str, Any]) -> Selection:
    """The selectors, each checked; also checks --repository, which _plan applies later."""
    import re

    from envbuild.core.errors import BadInput
    from envbuild.core.models import Selection
    from envbuild.core.names import repository_problem, shown
    from envbuild.knowledge.load import load_knowledge
    from envbuild.plan.compat import cuda_selector

    for key, example in _SELECTOR_EXAMPLES.items():
        value = kwargs[key]
        if value is not None and not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}", value):
            flag = "--os" if key == "os_name" else "--" + key.replace("_", "-")
            msg = f"{flag} {shown(value)}: not a plain name or version; give e.g. {example}"
            raise BadInput(msg)
    repository = kwargs.get("repository")
    if repository is not None:
        problem = repository_problem(repository, load_knowledge().frameworks)
        if problem is not None:
            msg = (
                f"--repository {shown(repository)}: {problem}; "
                "give e.g. registry.example.com:5000/team/{framework}"
            )
            raise BadInput(msg)
    cuda = kwargs.pop("cuda")
    selected = None if cuda is None else cuda_selector(cuda)
    if cuda is not None and selected is None:
        msg = (
            f"--cuda {shown(cuda)}: not a CUDA selector; give cpu, a major (12), "
            "a version (12.1) or a wheel tag (cu121)"
        )
        raise BadInput(msg)
    return Selection(
        framework=kwargs.pop("framework"),
        framework_version=kwargs.pop("framework_version"),
        cuda=selected,
        python=kwargs.pop("python"),
        os=kwargs.pop("os_name"),
        platform=platforms_from(kwargs.pop("platform", None)),
    )


def platforms_from(value: str | None) -> str | None:
    """--platform's platforms, each as envbuild names it, comma-separated; None when not given."""
    from envbuild.core.errors import BadInput
    from envbuild.core.names import shown
    from envbuild.core.platforms import PLATFORMS, platform_of

    if value is None:
        return None
    named = []
    for part in value.split(",") if len(value) <= 200 else [value]:
        platform = platform_of(part)
        if platform is None:
            msg = (
                f"--platform {shown(value, 60)}: {shown(part, 40)} is not a platform envbuild "
                f"builds for; give {' or '.join(PLATFORMS)}, or both comma-separated"
            )
            raise BadInput(msg)
        named.append(platform)
    return ",".join(dict.fromkeys(named))


def plan_from(
    kwargs: dict[str, Any], *, fleet: Fleet | None = None, newest_only: bool = False
) -> tuple[Knowledge, Matrix, Plan]:
    from envbuild.knowledge.load import load_knowledge
    from envbuild.plan.matrix import (
        fleet_alternatives,
        knowledge_matrix,
        make_plan,
        require_entries,
    )
    from envbuild.plan.matrix_file import default_matrix_path, load_matrix

    knowledge = load_knowledge()
    selection = selection_from(kwargs)
    matrix_file = kwargs.pop("matrix_file")
    if matrix_file is not None:
        matrix = load_matrix(matrix_file, knowledge)
    else:
        defaults = load_matrix(default_matrix_path(), knowledge)
        matrix = knowledge_matrix(knowledge, selection, defaults)
    repository = kwargs.pop("repository")
    if repository:
        matrix = dataclasses.replace(matrix, repository=repository)
    packages = packages_from(kwargs, knowledge, matrix, selection)
    user = kwargs.pop("user", None)  # None: as the matrix says (commands without --user)
    # Only the knowledge base's matrix is cut to the newest release: every entry of a matrix
    # file is one the user wrote, and none may silently disappear.
    newest_only = newest_only and matrix_file is None
    plan = make_plan(
        knowledge, matrix, selection, fleet=fleet, newest_only=newest_only, packages=packages,
        user=user,
    )  # fmt: skip
    try:
        require_entries(plan, matrix, selection)
    except SelectionError as exc:
        if fleet is None:
            raise
        msg = f"{exc.message}; {fleet_alternatives(knowledge, selection, fleet)}"
        raise SelectionError(msg) from exc
    return knowledge, matrix, plan


def packages_from(
    kwargs: dict[str, Any], knowledge: Knowledge, matrix: Matrix, selection: Selection
) -> tuple[str, ...]:
    """-p and -r, checked and normalized (none for commands without them)."""
    from envbuild.plan.packages import check_packages, framework_packages, read_requirements

    given = tuple(kwargs.pop("packages", ()) or ())
    files = tuple(kwargs.pop("requirements", ()) or ())
    if selection.framework is not None:
        frameworks = {selection.framework}
    else:
        frameworks = set(matrix.frameworks)
    names = framework_packages(knowledge, frameworks)
    found = check_packages(given, "-p/--package", names)
    for path in files:
        found += read_requirements(path, "-r/--requirements", names)
    return tuple(sorted(set(found)))


def package_options(func: F) -> F:
    """The team's packages, added to every selected entry (and so to its lock)."""
    options = [
        click.option(
            "-r",
            "--requirements",
            multiple=True,
            type=click.Path(path_type=Path),
            help="Requirements file (requirement lines and # comments only); repeatable.",
        ),
        click.option(
            "-p",
            "--package",
            "packages",
            multiple=True,
            metavar="REQ",
            help="Package to add to every entry, e.g. 'transformers>=4.40' (repeatable).",
        ),
    ]
    for option in options:
        func = option(func)
    return func


def user_option(func: F) -> F:
    """`--user envbuild|root`: who every selected entry's image runs as, over the matrix's choice."""
    from envbuild.core.models import IMAGE_UID, USER_CHOICES

    return click.option(
        "--user",
        type=click.Choice(USER_CHOICES),
        help=(
            f"Who the images run as: envbuild (uid {IMAGE_UID}, not root) or root "
            "[default: the matrix's user, else envbuild]."
        ),
    )(func)


def entry_options(func: F) -> F:
    """The options plan, render and build share: which entries (selectors), what each holds
    (packages, user) and where its wheels come from (fetch options)."""
    return selectors(package_options(user_option(fetch_options(func))))


def sign_option(func: F) -> F:
    """`--sign`: sign what is published with the key ENVBUILD_SIGNING_KEY names."""
    return click.option(
        "--sign",
        is_flag=True,
        help=(
            "Sign each published image and attest its smoke verdict, provenance and SBOM, in "
            "cosign's format (key: ENVBUILD_SIGNING_KEY, password: ENVBUILD_SIGNING_PASSWORD)."
        ),
    )(func)


def signing_key_from(sign: bool, registry: str | None, option: str) -> SigningKey | None:
    """The signing key for --sign, loaded (and its secrets registered) before any work; None
    without --sign. --sign without a registry to publish to is a mistake, said at once."""
    if not sign:
        return None
    if registry is None:
        msg = f"--sign signs what {option} publishes; add {option} REGISTRY"
        raise BadInput(msg)
    from envbuild.publish.keys import load_signing_key

    return load_signing_key()


def fleet_option(func: Callable[..., Any]) -> Callable[..., Any]:
    """`--gpu GPU` (repeatable): the fleet an image must have kernels for."""
    return click.option(
        "--gpu",
        "fleet_gpus",
        multiple=True,
        metavar="GPU",
        help=(
            "Refuse an image without kernels (SASS or PTX) for this GPU (H100, 'RTX 5090', "
            "sm_120, 12.0), read from its libraries; repeatable."
        ),
    )(func)


def fleet_from(knowledge: Knowledge, driver: str | None, gpus: tuple[str, ...]) -> Fleet | None:
    import difflib
    import re

    from envbuild.core.errors import BadInput
    from envbuild.core.models import Fleet
    from envbuild.core.names import shown
    from envbuild.plan.gpus import find_gpu, looks_like_cc

    if driver is None and not gpus:
        return None
    # ASCII digits, bounded: `\d` takes other scripts' digits, and 5,000 digits overflow int().
    if driver is not None and not re.fullmatch(r"[0-9]{1,6}(?:\.[0-9]{1,6}){0,2}", driver):
        msg = (
            f"--driver {shown(driver)} is not a driver version; give up to three dot-separated "
            "numbers of at most 6 digits (e.g. 535.104.05)"
        )
        raise BadInput(msg)
    found = []
    for text in gpus:
        gpu = find_gpu(knowledge, text) if text.isprintable() and len(text) <= 100 else None
        if gpu is None and looks_like_cc(text):
            msg = (
                f"--gpu {shown(text)} is not a compute capability; give sm_XY or X.Y with "
                "major X 1-20 and minor Y 0-9 in ASCII digits (e.g. sm_90, 9.0), or a GPU name"
            )
            raise BadInput(msg)
        if gpu is None:
            close = (
                difflib.get_close_matches(text, list(knowledge.gpus), n=3, cutoff=0.4)
                if text.isprintable() and len(text) <= 100
                else []
            )
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            msg = (
                f"--gpu {shown(text)} is not a GPU envbuild knows{hint} "
                "(or give its compute capability: sm_90 or 9.0)"
            )
            raise BadInput(msg)
        found.append(gpu)
    return Fleet(driver=driver, gpus=tuple(found))


def build_options_from(kwargs: dict[str, Any]) -> Any:
    """The fetch options, checked (each error names its option) and with links resolved."""
    from envbuild.build.render import check_options
    from envbuild.core.models import CLASSIC, BuildOptions, ProxySettings
    from envbuild.core.redact import register_url
    from envbuild.net.proxy import selected

    options = BuildOptions(
        proxy=selected() or ProxySettings(),  # what proxy_option chose; none for render/plan
        base_image=kwargs.pop("base_image", None),
        ca_bundle=kwargs.pop("ca_bundle", None),
        wheelhouse=kwargs.pop("wheelhouse", None),
        index_url=kwargs.pop("index_url", None),
        extra_index_urls=tuple(kwargs.pop("extra_index_url", ()) or ()),
        framework_index=kwargs.pop("framework_index", None),
        offline=kwargs.pop("offline", False),
        builder=kwargs.pop("builder", None) or CLASSIC,
    )
    for url in (options.index_url, *options.extra_index_urls, options.framework_index):
        register_url(url)  # before any message could show it
    return check_options(options)


def fetch_options(func: F) -> F:
    """Options that say where a build fetches packages from."""
    options = [
        click.option(
            "--offline", is_flag=True, help="Install only from --wheelhouse; use no index."
        ),
        click.option(
            "--extra-index-url", multiple=True, metavar="URL", help="Extra pip index (repeatable)."
        ),
        click.option(
            "--index-url", metavar="URL", help="pip index to use instead of PyPI (a mirror)."
        ),
        click.option(
            "--framework-index",
            metavar="URL|none",
            help=(
                "A mirror of the framework's own index (PyTorch's CPU/CUDA wheels), or `none` "
                "when --index-url serves them too [default: the entry's]."
            ),
        ),
        click.option(
            "--wheelhouse", type=click.Path(path_type=Path), help="Folder of wheels pip may use."
        ),
        click.option(
            "--ca-bundle",
            type=click.Path(path_type=Path),
            help="CA bundle for a TLS-intercepting proxy or private index.",
        ),
        click.option(
            "--base-image", metavar="REF", help="Base image instead of the entry's default."
        ),
    ]
    for option in options:
        func = option(func)
    return func


def builder_option(func: F) -> F:
    """`--builder auto|buildkit|classic` (or ENVBUILD_BUILDER); auto: BuildKit where it works."""
    return click.option(
        "--builder",
        type=click.Choice(["auto", "buildkit", "classic"]),
        default="auto",
        envvar="ENVBUILD_BUILDER",
        show_default=True,
        help=(
            "How images are built: buildkit (the docker client's BuildKit: secret mounts, a "
            "kept package cache, any engine), classic (the engine's API, inputs served from "
            "this host: a local engine), or auto (classic on an engine on this host, else "
            "BuildKit) [env: ENVBUILD_BUILDER]."
        ),
    )(func)


def proxy_option(func: F) -> F:
    """`--proxy URL`; the command runs with envbuild.net.proxy.current() set to the chosen proxy
    (--proxy, else the environment, else Docker's config). Goes below @reports_errors, so that
    a bad proxy is one line and exit 2."""

    @functools.wraps(func)
    def wrapper(*args: Any, proxy: str | None = None, **kwargs: Any) -> Any:
        from envbuild.net.proxy import chosen, settings_from_environment

        with chosen(settings_from_environment(proxy)):
            return func(*args, **kwargs)

    return click.option(
        "--proxy",
        metavar="URL",
        help=(
            "HTTP(S) proxy for envbuild and the build's RUN steps, "
            "http://[user:password@]host:port [default: HTTPS_PROXY/HTTP_PROXY/NO_PROXY, "
            "else Docker's config proxies.default]."
        ),
    )(wrapper)  # type: ignore[return-value]


def ca_bundle_option(func: F) -> F:
    """`--ca-bundle FILE` for commands that talk to a registry: its CAs are trusted besides the
    default store (envbuild.net.trust). Goes below @reports_errors, so that a bad file is one line."""

    @functools.wraps(func)
    def wrapper(*args: Any, ca_bundle: Path | None = None, **kwargs: Any) -> Any:
        from envbuild.build.render import check_ca_bundle
        from envbuild.net.trust import trusting

        with trusting(None if ca_bundle is None else check_ca_bundle(ca_bundle)):
            return func(*args, **kwargs)

    return click.option(
        "--ca-bundle",
        type=click.Path(path_type=Path),
        help="CA bundle (PEM) that signs the registry's certificate, or a TLS-intercepting proxy's.",
    )(wrapper)  # type: ignore[return-value]
