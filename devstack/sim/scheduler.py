"""``python -m devstack.sim.scheduler --rank N``: one tensor-parallel scheduler.

It holds (simulated) GPU memory registrations, so its cleanup is the ``--teardown-s`` that
matters; it arms PDEATHSIG like SGLang's schedulers, so a parent that dies first SIGKILLs it.
"""

from __future__ import annotations

from devstack.sim.child import ChildProcess, run_child
from devstack.sim.roles import Role


class Scheduler(ChildProcess):
    role = Role.SCHEDULER


if __name__ == "__main__":
    run_child(Scheduler)
