"""``python -m devstack.sim.helper``: a process a child starts during its own shutdown.

It stands for whatever an engine spawns while tearing down (a flush worker, a compile
helper): it does not arm PDEATHSIG and runs until SIGTERM, so only a kill that notices new
processes during the shutdown ends it gracefully.
"""

from __future__ import annotations

from devstack.sim.child import ChildProcess, run_child
from devstack.sim.roles import Role


class Helper(ChildProcess):
    role = Role.HELPER
    arm_pdeathsig = False


if __name__ == "__main__":
    run_child(Helper)
