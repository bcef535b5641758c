"""``python -m coordinator.sim.detokenizer``: the detokenizer child of the main process."""

from __future__ import annotations

from coordinator.sim.child import ChildProcess, run_child
from coordinator.sim.roles import Role


class Detokenizer(ChildProcess):
    role = Role.DETOKENIZER


if __name__ == "__main__":
    run_child(Detokenizer)
