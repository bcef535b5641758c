"""The images the manifests name, built by podman from deploy/container/Dockerfile on a base
made here, and run as the manifests run them: a non-root user, a read-only root, no
capabilities, the health check passing (``podman healthcheck run``)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.deploy.rendering import KUBERNETES_DIR
from tests.pods.images import ENGINE_HOOK, SIDECAR, Images
from tests.pods.overlays import rendered
from tests.pods.podman import REPO, Podman
from tests.support.processes import wait_for

pytestmark = [pytest.mark.container, pytest.mark.timeout(1200)]

TOKEN = "image-test-token-0123456789abcdef"
HOOK = "/opt/shutdown-coordinator/hook/drain_hook.py"
RUN = "/var/run/shutdown-coordinator"


@pytest.fixture(scope="module")
def sidecar(images: Images) -> str:
    return images.sidecar()


@pytest.fixture
def token(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    path.chmod(0o444)
    return path


@pytest.fixture
def containers(podman: Podman) -> Iterator[list[str]]:
    names: list[str] = []
    yield names
    if names:
        podman.run("rm", "-f", "-t", "0", *names, check=False)


def _run(podman: Podman, names: list[str], name: str, *args: str) -> str:
    names.append(name)
    podman.run("run", "--detach", "--name", name, *podman.labels(name),
               "--health-interval=disable", *args)
    return name


def coordinator_env() -> dict[str, str]:
    """The base's coordinator settings (deploy/kubernetes/base/coordinator.env), without
    their ``SHUTDOWN_COORDINATOR_`` prefix."""
    prefix = "SHUTDOWN_COORDINATOR_"
    lines = (KUBERNETES_DIR / "base" / "coordinator.env").read_text().splitlines()
    pairs = (line.split("=", 1) for line in lines if line.startswith(prefix) and "=" in line)
    return {key.removeprefix(prefix): value for key, value in pairs}


def _listening(podman: Podman, name: str) -> bool:
    logs = podman.run("logs", name, check=False)
    assert podman.inspect(name)["State"]["Running"], logs.stdout + logs.stderr
    return "shutdown-coordinator listening" in logs.stdout + logs.stderr


def test_the_sidecar_image_is_what_the_manifests_expect(podman: Podman, sidecar: str) -> None:
    """The image: a numeric non-root user, ``shutdown-coordinator serve`` in exec form, the
    port of the base's coordinator.env, a health check kept in the image (docker format)."""
    image = podman.json("image", "inspect", sidecar)[0]
    config = image["Config"]
    assert config["User"] == "65532:65532"
    assert config["Entrypoint"] == ["shutdown-coordinator"]
    assert config["Cmd"] == ["serve"]
    assert "8787/tcp" in config["ExposedPorts"]
    env = dict(item.split("=", 1) for item in config["Env"])
    assert env["SHUTDOWN_COORDINATOR_PORT"] == "8787"
    assert "SHUTDOWN_COORDINATOR_PORT=8787" in (
        KUBERNETES_DIR / "base" / "coordinator.env").read_text()
    assert image["ManifestType"] == "application/vnd.docker.distribution.manifest.v2+json"
    assert image["Healthcheck"]["Test"][0] == "CMD"
    assert image["Healthcheck"]["Test"][1:] == [
        "python3", "/usr/local/lib/shutdown-coordinator/healthcheck.py"]


def test_run_as_the_manifests_run_it_the_health_check_passes_and_sigterm_exits_0(
        podman: Podman, sidecar: str, token: Path, tmp_path: Path,
        containers: list[str]) -> None:
    """1. The sidecar as the coordinator container of the manifests: the pod's UID
       (1000:1000), a read-only root, every capability dropped, no privilege escalation,
       the token and its emptyDirs (/tmp, state, doorbell) mounted.
    2. It listens; ``podman healthcheck run`` exits 0 and podman records it healthy.
    3. ``podman stop`` (SIGTERM): the runtime records exit 0.

    The state file and doorbell paths are the base's (coordinator.env): the state file in a
    directory the coordinator makes inside the world-writable emptyDir, which it refuses
    to keep the file in directly."""
    manifests = coordinator_env()
    assert manifests["STATE_FILE"].startswith(f"{RUN}/state/"), manifests
    assert manifests["DOORBELL"].startswith(f"{RUN}/doorbell/"), manifests
    volumes = []
    for name in ("tmp", "state", "doorbell"):
        directory = tmp_path / name
        directory.mkdir()
        directory.chmod(0o777)
        volumes.append(directory)
    name = _run(podman, containers, "image-test-as-manifests",
                "--user", "1000:1000", "--read-only", "--read-only-tmpfs=false",
                "--cap-drop", "ALL", "--security-opt", "no-new-privileges",
                "--volume", f"{token}:{RUN}/token/token:ro",
                "--volume", f"{volumes[0]}:/tmp",
                "--volume", f"{volumes[1]}:{RUN}/state",
                "--volume", f"{volumes[2]}:{RUN}/doorbell",
                "--env", f"SHUTDOWN_COORDINATOR_TOKEN_FILE={RUN}/token/token",
                "--env", f"SHUTDOWN_COORDINATOR_STATE_FILE={manifests['STATE_FILE']}",
                "--env", f"SHUTDOWN_COORDINATOR_DOORBELL={manifests['DOORBELL']}",
                sidecar)
    wait_for(lambda: _listening(podman, name), timeout=120, what="the coordinator listening")
    check = podman.run("healthcheck", "run", name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    assert podman.inspect(name)["State"]["Health"]["Status"] == "healthy"
    stopped = podman.run("stop", "-t", "30", name, check=False)
    assert "resorting to SIGKILL" not in stopped.stderr
    assert podman.inspect(name)["State"]["ExitCode"] == 0


def test_a_read_only_root_without_any_volume_still_serves(
        podman: Podman, sidecar: str, token: Path, containers: list[str]) -> None:
    """The image alone with a read-only root and nothing writable (no /tmp volume): the
    coordinator serves without a doorbell (it says so) and its health check passes."""
    name = _run(podman, containers, "image-test-read-only",
                "--read-only", "--read-only-tmpfs=false", "--cap-drop", "ALL",
                "--volume", f"{token}:/token:ro", "--env", "SHUTDOWN_COORDINATOR_TOKEN_FILE=/token",
                sidecar)
    wait_for(lambda: _listening(podman, name), timeout=120, what="the coordinator listening")
    check = podman.run("healthcheck", "run", name, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    logs = podman.run("logs", name)
    assert "no doorbell" in logs.stdout + logs.stderr


def test_the_engine_target_adds_the_hook_and_worker_client_to_an_engine_base(
        podman: Podman, images: Images) -> None:
    """The recipe's engine target on the engine base: the preStop hook at the path the
    manifests' preStop command runs, ``worker_client`` importable by the image's python3
    (and nothing of the coordinator), the manifests' engine user."""
    image = images.engine_hook()
    config = podman.json("image", "inspect", image)[0]["Config"]
    assert config["User"] == "1000:1000"
    probe = ("import importlib.util as u, json, os, worker_client; print(json.dumps("
             "[worker_client.__file__, u.find_spec('coordinator') is None, "
             f"os.access({HOOK!r}, os.R_OK)]))")
    done = podman.run("run", "--rm", *podman.labels("image-test-engine"),
                      "--read-only", image, "python3", "-c", probe)
    where, no_coordinator, hook = json.loads(done.stdout)
    assert where.startswith("/usr/local/lib/python3")
    assert no_coordinator
    assert hook
    same = podman.run("run", "--rm", *podman.labels("image-test-engine"), image,
                      "cat", HOOK)
    assert same.stdout == (KUBERNETES_DIR / "base" / "drain_hook.py").read_text()
    assert image == ENGINE_HOOK
    assert SIDECAR.startswith("ghcr.io/shutdown-coordinator/shutdown-coordinator:")


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_the_drainable_target_holds_the_server_its_migrating_overlay_runs(
        podman: Podman, images: Images, tmp_path: Path, engine: str) -> None:
    """1. The recipe's drainable target for ``engine`` on the engine base.
    2. The ``<engine>-migrating`` overlay's engine command (``python3 FILE``) runs a file the
       image holds: the repository's drainable server for that engine, byte for byte,
       readable by the manifests' engine user (the image's user) on a read-only root.
    3. The engine target's part is kept: the hook at the manifests' path and a python3 that
       imports ``worker_client``, which the server registers through."""
    image = images.drainable(engine)
    manifest = rendered(f"{engine}-migrating", tmp_path / "render")
    python, server = manifest.engine["command"]
    assert python == "python3"
    config = podman.json("image", "inspect", image)[0]["Config"]
    assert config["User"] == "1000:1000"
    labels = podman.labels("image-test-drainable")
    shown = podman.run("run", "--rm", *labels, "--read-only", image, "cat", server)
    assert shown.stdout == (REPO / "deploy" / "examples" / engine / "drainable_server.py"
                            ).read_text()
    probe = f"import os, worker_client; print(os.access({HOOK!r}, os.R_OK))"
    done = podman.run("run", "--rm", *labels, "--read-only", image, "python3", "-c", probe)
    assert done.stdout.strip() == "True"
