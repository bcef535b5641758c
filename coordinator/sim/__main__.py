"""``python -m coordinator.sim``: start the simulated engine (see main_process)."""

from coordinator.sim.main_process import main

main()
