"""The simulated engine's knobs: one typed field each, also its command-line flag."""

from __future__ import annotations

import argparse
import ast
import inspect
import itertools
import textwrap
from dataclasses import dataclass, fields
from typing import Any

from devstack.sim.errors import SimArgumentError
from devstack.sim.roles import Role


@dataclass(frozen=True)
class EngineKnobs:
    """How the simulated engine is shaped and how it behaves on shutdown."""

    host: str = "127.0.0.1"
    port: int = 0
    """0 picks a free port; the ready file tells which."""
    schedulers: int = 2
    """Scheduler children of the main process (one per tensor-parallel rank). With ``dp``
    they are not started: the DP controller's schedulers take their place."""
    dp: int = 0
    """When > 0, a data-parallel controller with this many schedulers of its own."""
    token_interval_ms: float = 20.0
    """Milliseconds between two streamed tokens (per request)."""
    hold_after_tokens: int = 0
    """When > 0, every stream stops after this many tokens and waits for a hand-back (a
    drain, ``POST /internal/handoff``) to end it, instead of the token clock: tests hand a
    request back at a known point without racing it. A stream of at most this many tokens
    is not held."""
    teardown_s: float = 0.0
    """Seconds of cleanup each process runs after the signal it honours (RDMA
    deregistration, say). A process killed during it leaves ``cleanup: "started"``."""
    ignore_sigterm: tuple[str, ...] = ()
    """Processes (``ROLE`` or ``ROLE:RANK``) that note SIGTERM and carry on."""
    fork_on_shutdown: tuple[str, ...] = ()
    """Processes (``ROLE`` or ``ROLE:RANK``) that start a helper process when their cleanup
    begins, and wait for it at the end of their cleanup."""
    daemonize: tuple[str, ...] = ()
    """Children (``ROLE`` or ``ROLE:RANK``) that start a daemon once they are up: a double
    fork and ``setsid``, so it leaves their tree, session and process group (only a unit,
    the engine's cgroup or mount namespace, still holds it). It writes its end record as
    role ``daemon``, is listed in the ready file, and runs until SIGTERM."""
    watchdog: bool = True
    """The main process SIGKILLs the whole tree when a child dies (as SGLang's
    ``SubprocessWatchdog`` does), unless stood down first."""
    graceful_main: bool = False
    """Main process on SIGTERM: False mimics stock SGLang (SIGKILL its tree and itself,
    exit status 137); True hands back in-flight requests, stops its children with SIGTERM,
    a bounded wait and SIGKILL for stragglers, and exits 0."""
    serve_open_streams_s: float = 0.0
    """When > 0, the main process on SIGTERM serves its open streams to their end instead:
    it stops accepting, waits up to this many seconds for every open response (the engine's
    own graceful wait: vLLM's ``--shutdown-timeout``, SGLang's SIGTERM watchdog), cuts what
    is left, then stops its children as ``graceful_main`` does and exits 0. 0: as
    ``graceful_main`` says."""
    sigkill_leftovers: bool = False
    """When the main process stops its children on its own shutdown (``graceful_main``,
    ``serve_open_streams_s``): only the schedulers (and a DP controller) get SIGTERM and a
    bounded wait; whatever is left below it then (the detokenizer) gets SIGKILL, as SGLang
    0.5.23's shutdown does: ``ShutdownReq`` lets its schedulers leave and exit 0, then
    ``kill_process_tree`` SIGKILLs its detokenizer, whose loop has no way out but a signal
    (measured on the real engine, docs/engines.md)."""
    dp_no_propagate: bool = False
    """The DP controller exits on SIGTERM without stopping its schedulers (the failure mode:
    PDEATHSIG SIGKILLs them)."""
    child_timeout_s: float = 10.0
    """How long a parent that stops its children gracefully waits before SIGKILL."""
    startup_timeout_s: float = 60.0
    """How long the main process waits for its children to come up."""
    coordinator: str = ""
    """URL of a shutdown coordinator: register with it through ``worker_client``, track
    every request, hand requests back on its drain (see ``devstack.sim.coordination``)."""
    coordinator_token_file: str = ""
    """File holding the coordinator's bearer token, if it needs one."""
    nnodes: int = 1
    """Pods the engine spans (SGLang's ``--nnodes``; a LeaderWorkerSet's ``LWS_GROUP_SIZE``).
    Above 1 each pod runs ``schedulers`` ranks of one collective group, and only pod 0 serves
    HTTP (``devstack.sim.group``)."""
    node_rank: int = 0
    """This pod's place in the group (``--node-rank``; ``LWS_WORKER_INDEX``): 0 leads."""
    dist_init_addr: str = ""
    """``HOST:PORT`` where rank 0 listens for the other ranks (``--dist-init-addr``; the
    leader pod's address, ``LWS_LEADER_ADDRESS``). Needed when ``nnodes`` > 1."""
    collective_timeout_s: float = 30.0
    """How long a rank waits in a collective step for the others before it aborts, as
    NCCL's watchdog does (torch's default is 10 minutes; a test wants seconds)."""
    rank0_sigterm_finishes: bool = True
    """Rank 0's own SIGTERM finishes the group (every rank told to finish) before it exits.
    False: it just leaves, as an SGLang scheduler does, and only the leader's main process
    (its graceful SIGTERM, ``POST /internal/group/finish``) ends the group cleanly."""

    def __post_init__(self) -> None:
        if self.schedulers < 0 or self.dp < 0 or self.hold_after_tokens < 0:
            raise SimArgumentError("--schedulers, --dp and --hold-after-tokens must be >= 0")
        if self.token_interval_ms < 0 or self.teardown_s < 0 or self.child_timeout_s < 0 \
                or self.serve_open_streams_s < 0:
            raise SimArgumentError("intervals and timeouts must be >= 0")
        self._check_group()
        roles = {r.value for r in Role}
        for spec in (*self.ignore_sigterm, *self.fork_on_shutdown, *self.daemonize):
            name, sep, rank = spec.partition(":")
            if name not in roles or (sep and not rank.isdigit()):
                raise SimArgumentError(f"{spec!r} is not ROLE or ROLE:RANK ({sorted(roles)})")

    def _check_group(self) -> None:
        if self.nnodes < 1 or not 0 <= self.node_rank < self.nnodes:
            raise SimArgumentError("--nnodes must be >= 1 and 0 <= --node-rank < --nnodes")
        if self.collective_timeout_s <= 0:
            raise SimArgumentError("--collective-timeout-s must be > 0")
        if self.nnodes == 1:
            return
        host, _, port = self.dist_init_addr.rpartition(":")
        if not host or not port.isdigit():
            raise SimArgumentError("--nnodes > 1 needs --dist-init-addr HOST:PORT")
        if self.dp or self.schedulers < 1:
            raise SimArgumentError("--nnodes > 1 needs --schedulers >= 1 and no --dp")

    def to_argv(self) -> list[str]:
        """Command-line flags that reproduce these knobs (defaults omitted)."""
        default = EngineKnobs()
        argv: list[str] = []
        for f in fields(self):
            value = getattr(self, f.name)
            flag = "--" + f.name.replace("_", "-")
            if value == getattr(default, f.name):
                continue
            if isinstance(value, bool):
                argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
            elif isinstance(value, tuple):
                for item in value:
                    argv += [flag, item]
            else:
                argv += [flag, str(value)]
        return argv

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        default = cls()
        docs = _attribute_docstrings(cls)
        for f in fields(cls):
            value = getattr(default, f.name)
            flag = "--" + f.name.replace("_", "-")
            help_text = docs.get(f.name, "").replace("%", "%%")
            if isinstance(value, bool):
                parser.add_argument(
                    flag, action=argparse.BooleanOptionalAction, default=value, help=help_text
                )
            elif isinstance(value, tuple):
                parser.add_argument(
                    flag, action="append", default=[], metavar="ROLE[:RANK]", help=help_text
                )
            else:
                help_text += " (default: %(default)s)"
                parser.add_argument(flag, type=type(value), default=value, help=help_text)

    @classmethod
    def from_namespace(cls, ns: argparse.Namespace) -> EngineKnobs:
        values: dict[str, Any] = {}
        for f in fields(cls):
            value = getattr(ns, f.name)
            values[f.name] = tuple(value) if isinstance(value, list) else value
        return cls(**values)


def _attribute_docstrings(cls: type) -> dict[str, str]:
    """The docstrings under each field, so ``--help`` says what the fields' docs say."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(cls)))
    except (OSError, TypeError):
        return {}
    body = tree.body[0].body if tree.body and isinstance(tree.body[0], ast.ClassDef) else []
    docs: dict[str, str] = {}
    for node, following in itertools.pairwise(body):
        if (
            isinstance(node, ast.AnnAssign)
            and isinstance(node.target, ast.Name)
            and isinstance(following, ast.Expr)
            and isinstance(following.value, ast.Constant)
            and isinstance(following.value.value, str)
        ):
            docs[node.target.id] = " ".join(following.value.value.split()).replace("``", "")
    return docs
