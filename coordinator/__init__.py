"""shutdown-coordinator: drain LLM inference pods without losing a request or leaking a process.

Packages:

- ``coordinator.kill``   ordered graceful kill of process trees (a library; no HTTP needed)
- ``coordinator.drain``  the drain state machine, its budget and its persisted state
- ``coordinator.service`` the sidecar's HTTP API (FastAPI on uvicorn)

The simulated engine, the demo and the reference router are in ``devstack``, which nothing here
imports.
"""

__version__ = "0.1.0"
