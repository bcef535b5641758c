"""The coordinator's container recipe (deploy/container/), checked without a container
engine: what the image runs, as whom, and its health check, which runs for real."""

from __future__ import annotations

import fnmatch
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from coordinator import settings
from tests.deploy import dockerfile
from tests.deploy.rendering import REPO
from tests.service.servers import start_coordinator
from tests.support.processes import ProcessJanitor

CONTAINER = REPO / "deploy" / "container"
DOCKERFILE = CONTAINER / "Dockerfile"
HEALTHCHECK = CONTAINER / "healthcheck.py"
SMALL_BASES = ("-slim", "-alpine", "distroless")


@pytest.fixture(scope="module")
def final() -> dockerfile.Stage:
    stages = dockerfile.parse(DOCKERFILE)
    assert len(stages) >= 2, "build in a separate stage so the image carries no build tools"
    return stages[-1]


def test_image_is_small_and_runs_as_a_numeric_non_root_user(final: dockerfile.Stage) -> None:
    """1. The final stage starts from a slim base.
    2. Its last USER is numeric (so the kubelet can check runAsNonRoot) and not 0.
    """
    assert any(marker in final.base for marker in SMALL_BASES), final.base
    user = final.last("USER")
    assert user is not None, "no USER: the image would run as root"
    uid, _, gid = user.arguments.partition(":")
    assert uid.isdigit(), f"USER {user.arguments} is not numeric"
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)


def test_entrypoint_is_the_console_script(final: dockerfile.Stage) -> None:
    """1. ENTRYPOINT is the project's console script and CMD is `serve` (exec forms, so
       SIGTERM reaches the coordinator, not a shell).
    2. The console script is the one pyproject.toml declares.
    """
    entrypoint = final.last("ENTRYPOINT")
    cmd = final.last("CMD")
    assert entrypoint is not None
    assert cmd is not None
    assert entrypoint.exec_form() == ["shutdown-coordinator"]
    assert cmd.exec_form() == ["serve"]
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "shutdown-coordinator" in scripts


def test_healthcheck_runs_a_script_the_image_contains(final: dockerfile.Stage) -> None:
    """1. HEALTHCHECK uses the exec form and bounds each probe with a timeout.
    2. The script it runs is copied into the final stage from deploy/container/.
    """
    check = final.last("HEALTHCHECK")
    assert check is not None, "no HEALTHCHECK"
    assert "--timeout=" in check.arguments
    command = check.arguments[check.arguments.index("CMD") + 3 :].strip()
    argv = dockerfile.Instruction("CMD", command, check.line).exec_form()
    assert argv is not None
    assert argv[0].startswith("python")
    copies = {c.words()[-1]: c.words()[-2] for c in final.all("COPY")}
    assert argv[1] in copies, f"{argv[1]} is not copied into the image"
    assert (REPO / copies[argv[1]]).resolve() == HEALTHCHECK


def test_every_copied_path_exists_and_is_in_the_build_context() -> None:
    """1. Every COPY source (not from another stage) exists in the repository.
    2. The Dockerfile's own .dockerignore lets it into the build context.
    """
    ignore = [
        line.strip()
        for line in (CONTAINER / "Dockerfile.dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for stage in dockerfile.parse(DOCKERFILE):
        for copy in stage.all("COPY"):
            words = copy.words()
            if any(w.startswith("--from") for w in words):
                continue
            sources = [w for w in words[:-1] if not w.startswith("--")]
            for source in sources:
                assert (REPO / source).exists(), f"line {copy.line}: {source} does not exist"
                assert _included(source.rstrip("/"), ignore), f"{source} is ignored"


def _included(path: str, patterns: list[str]) -> bool:
    included = True
    for pattern in patterns:
        negated = pattern.startswith("!")
        glob = pattern.lstrip("!").rstrip("/")
        if fnmatch.fnmatch(path, glob) or path.startswith(glob + "/"):
            included = negated
    return included


def test_default_port_matches_the_coordinator_and_the_manifests(final: dockerfile.Stage) -> None:
    """1. The image exposes the port it configures in SHUTDOWN_COORDINATOR_PORT.
    2. That is the coordinator's default and the port the Kubernetes base uses.
    """
    exposed = final.last("EXPOSE")
    assert exposed is not None
    env = " ".join(i.arguments for i in final.all("ENV"))
    assert f"SHUTDOWN_COORDINATOR_PORT={exposed.arguments}" in env
    assert int(exposed.arguments) == settings.DEFAULT_PORT
    base_env = (REPO / "deploy/kubernetes/base/coordinator.env").read_text()
    assert f"SHUTDOWN_COORDINATOR_PORT={exposed.arguments}" in base_env


def _healthcheck(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_healthcheck_passes_against_a_live_coordinator(
    janitor: ProcessJanitor, tmp_path: Path
) -> None:
    """1. Start the real coordinator on a free loopback port.
    2. Run the health check with the environment the image sets (wildcard host, the port).
    3. It exits 0.
    """
    running = start_coordinator(janitor, tmp_path)
    port = running.url.rsplit(":", 1)[1]
    done = _healthcheck({"SHUTDOWN_COORDINATOR_HOST": "0.0.0.0", "SHUTDOWN_COORDINATOR_PORT": port})
    assert done.returncode == 0, done.stdout + done.stderr


def test_healthcheck_fails_when_nothing_answers(janitor: ProcessJanitor, tmp_path: Path) -> None:
    """1. Start a coordinator, note its port, stop it (SIGTERM) and wait for it to exit.
    2. The health check against that port exits 1 and says why.
    """
    running = start_coordinator(janitor, tmp_path)
    port = running.url.rsplit(":", 1)[1]
    running.proc.terminate()
    assert running.proc.wait(timeout=30) == 0
    done = _healthcheck(
        {"SHUTDOWN_COORDINATOR_HOST": "127.0.0.1", "SHUTDOWN_COORDINATOR_PORT": port}
    )
    assert done.returncode == 1
    assert "unhealthy" in done.stdout
