"""``python -m devstack.sim.detokenizer``: the detokenizer child of the main process."""

from __future__ import annotations

from devstack.sim.child import ChildProcess, run_child
from devstack.sim.roles import Role


class Detokenizer(ChildProcess):
    role = Role.DETOKENIZER


if __name__ == "__main__":
    run_child(Detokenizer)
