"""``python -m devstack.sim.daemon``: a process an engine child daemonized (``--daemonize``).

It stands for what some engines leave behind (a cache server, a metrics agent started with a
double fork): no PDEATHSIG, reparented away from the engine's tree, in a session of its own.
Like every child it writes its end record and runs until SIGTERM, then its cleanup, exit 0.
"""

from __future__ import annotations

from devstack.sim.child import ChildProcess, run_child
from devstack.sim.roles import Role


class Daemon(ChildProcess):
    role = Role.DAEMON
    arm_pdeathsig = False
    expects_parent = False


if __name__ == "__main__":
    run_child(Daemon)
