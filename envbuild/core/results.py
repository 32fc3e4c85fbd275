"""What a run produced, per entry: the smoke test's checks and result, and the entry's outcome.
Frozen dataclasses, like models; of envbuild, this module imports only models."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from envbuild.core.models import BuiltImage, Entry


@dataclass(frozen=True, kw_only=True)
class SmokeCheck:
    """One host-side check of the payload's report."""

    name: str
    passed: bool
    detail: str

    def as_dict(self) -> dict[str, Any]:
        """Plain mapping for reports."""
        return {"name": self.name, "passed": self.passed, "detail": self.detail}


@dataclass(frozen=True, kw_only=True)
class SmokeResult:
    """What the payload reported inside the container and what the host made of it."""

    image: str
    image_id: str
    payload: dict[str, Any]
    checks: tuple[SmokeCheck, ...]
    exit_code: int | None
    seconds: float
    stderr_tail: str

    @property
    def passed(self) -> bool:
        """True only when every check passed."""
        return bool(self.checks) and all(c.passed for c in self.checks)

    def as_dict(self) -> dict[str, Any]:
        """The payload's JSON plus `passed` and the host-side `checks`."""
        return {
            **self.payload,
            "passed": self.passed,
            "checks": [c.as_dict() for c in self.checks],
            "image": self.image,
            "image_id": self.image_id,
            "exit_code": self.exit_code,
            "seconds": round(self.seconds, 3),
        }

    @classmethod
    def from_report(cls, report: dict[str, Any], *, image: str, image_id: str) -> SmokeResult:
        """The result a recorded report (`as_dict`) stands for, for an image vetted before."""
        host_keys = {"passed", "checks", "image", "image_id", "exit_code", "seconds"}
        raw_checks = report.get("checks")
        checks = tuple(
            SmokeCheck(name=str(c["name"]), passed=bool(c["passed"]), detail=str(c["detail"]))
            for c in (raw_checks if isinstance(raw_checks, list) else [])
        )
        return cls(
            image=image,
            image_id=image_id,
            payload={k: v for k, v in report.items() if k not in host_keys},
            checks=checks,
            exit_code=0,
            seconds=0.0,
            stderr_tail="",
        )

    def failed_checks(self) -> str:
        """The failed checks as one line: `name: detail; ...`."""
        return "; ".join(f"{c.name}: {c.detail}" for c in self.checks if not c.passed)


@dataclass(frozen=True, kw_only=True)
class EntryResult:
    """What happened to one entry in a build run."""

    entry: Entry
    image: BuiltImage | None
    smoke: SmokeResult | None
    error: str | None
    smoke_reused: bool = False  # the image was vetted before; its recorded result stands
    seconds: float = 0.0
    published: str | None = None  # host/repo:tag@digest the registry holds, vetted: not built
    pushed: str | None = None  # host/repo:tag@digest this run published (build --push)

    @property
    def passed(self) -> bool:
        """Published already, or built (or found) and, when smoke-tested, passed."""
        if self.error is not None:
            return False
        if self.published is not None:
            return True
        return self.image is not None and (self.smoke is None or self.smoke.passed)

    @property
    def status(self) -> str:
        """published (already, nothing built), built, found, or failed."""
        if self.published is not None and self.error is None:
            return "published"
        if self.image is None:
            return "failed"
        return "built" if self.image.built else "found"

    @property
    def failure_reason(self) -> str:
        """Why the entry failed: its error, else its failed smoke checks (empty if neither)."""
        if self.error:
            return self.error
        return self.smoke.failed_checks() if self.smoke is not None else ""

    def as_dict(self) -> dict[str, Any]:
        """The report's shape for one entry."""
        image = None
        if self.image is not None:
            image = {
                "id": self.image.id,
                "tags": list(self.image.tags),
                "log": str(self.image.log_path) if self.image.log_path else None,
                "seconds": round(self.image.seconds, 3),
                # How its framework image was had, by key: "framework torch … (key …): built …"
                "framework": self.image.framework or None,
            }
        return {
            "entry": self.entry.as_dict(),
            "image": image,
            "status": self.status,
            "published": self.published,
            "pushed": self.pushed,
            "passed": self.passed,
            "error": self.error,
            "smoke": self.smoke.as_dict() if self.smoke is not None else None,
            "smoke_reused": self.smoke_reused,
            "seconds": round(self.seconds, 3),
        }
