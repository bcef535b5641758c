"""A pod stack on one machine for the demo, the tests and the benchmarks; not the product.

Modules:

- ``devstack.sim``              a simulated multi-process inference engine shaped like SGLang
                                (``python -m devstack.sim``)
- ``devstack.local_stack``      pods on loopback: coordinators, simulated engines, the router
- ``devstack.streaming_load``   concurrent streaming completions, each checked token by token
- ``devstack.reference_router`` a streaming router built on ``router_client`` (Starlette on
                                uvicorn; ``python -m devstack.reference_router``)
- ``devstack.demo``             the ``shutdown-coordinator-demo`` command

It ships in the same distribution as the product, so the README's demo runs after a plain
install, but nothing in ``coordinator``, ``worker_client`` or ``router_client`` imports it
(ruff's banned-api rule and ``tests/test_layering.py``); it may import all three.
"""
