"""Stopping the engines the tests start (rootless Docker, Podman's service) as their own processes."""

from __future__ import annotations

import signal
import subprocess


def stop(process: subprocess.Popen[bytes], seconds: float) -> None:
    """SIGTERM (the engine stops its containers), then SIGKILL after `seconds`; no-op if ended."""
    if process.poll() is not None:
        return
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=seconds)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout=seconds)
