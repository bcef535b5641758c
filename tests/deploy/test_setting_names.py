"""Every SHUTDOWN_COORDINATOR_* variable the deployment files set is one the coordinator or
its clients read: a renamed setting fails here instead of being silently ignored."""

from __future__ import annotations

import re

from coordinator import settings
from tests.deploy.rendering import REPO

NAME = re.compile(r"SHUTDOWN_COORDINATOR_[A-Z0-9_]*[A-Z0-9]")
CLIENT_NAMES = {
    "SHUTDOWN_COORDINATOR_URL",
    "SHUTDOWN_COORDINATOR_TOKEN_FILE",
    "SHUTDOWN_COORDINATOR_TOKEN",
}
"""Read by `shutdown-coordinator drain`, worker_client and the drain hook."""


def test_deploy_files_name_only_known_settings() -> None:
    """1. Collect every SHUTDOWN_COORDINATOR_* name in deploy/.
    2. Each is a coordinator setting (ENV_PREFIX + field name) or a client variable.
    """
    known = {settings.ENV_PREFIX + name.upper() for name in settings.Settings.model_fields}
    known |= CLIENT_NAMES
    used: dict[str, set[str]] = {}
    for path in (REPO / "deploy").rglob("*"):
        if path.is_file() and "__pycache__" not in path.parts:
            for name in NAME.findall(path.read_text(errors="replace")):
                used.setdefault(name, set()).add(str(path.relative_to(REPO)))
    unknown = {name: sorted(paths) for name, paths in used.items() if name not in known}
    assert not unknown, f"unknown setting names: {unknown}"
    assert "SHUTDOWN_COORDINATOR_GRACE_PERIOD_S" in used
