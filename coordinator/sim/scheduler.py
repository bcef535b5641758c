"""``python -m coordinator.sim.scheduler --rank N``: one tensor-parallel scheduler.

It holds (simulated) GPU memory registrations, so its cleanup is the ``--teardown-s`` that
matters; it arms PDEATHSIG like SGLang's schedulers, so a parent that dies first SIGKILLs it.
"""

from __future__ import annotations

from coordinator.sim.child import ChildProcess, run_child
from coordinator.sim.roles import Role


class Scheduler(ChildProcess):
    role = Role.SCHEDULER


if __name__ == "__main__":
    run_child(Scheduler)
