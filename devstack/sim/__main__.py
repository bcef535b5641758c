"""``python -m devstack.sim``: start the simulated engine (see main_process)."""

from devstack.sim.main_process import main

main()
