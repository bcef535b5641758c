"""A simulated multi-process inference engine, shaped like SGLang, for tests, demo and bench.

``python -m coordinator.sim`` starts a main process (streaming completions over HTTP, a child
watchdog), scheduler children with ``PR_SET_PDEATHSIG(SIGKILL)``, a detokenizer, and with
``--dp N`` a data-parallel controller whose schedulers are its own children. Every process
records how it ended. ``start_engine`` starts one and waits until it is up;
``expected_tokens`` says what it will stream for a prompt.
"""

from coordinator.sim.knobs import EngineKnobs
from coordinator.sim.launcher import EngineHandle, SimProcess, start_engine
from coordinator.sim.roles import Role
from coordinator.sim.tokens import expected_tokens

__all__ = ["EngineHandle", "EngineKnobs", "Role", "SimProcess", "expected_tokens", "start_engine"]
