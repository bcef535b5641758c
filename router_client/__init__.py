"""The router side of shutdown-coordinator: watch coordinators, continue handed-back requests.

    watcher = Watcher({"http://10.0.0.5:8000": "http://10.0.0.5:8787"})
    watcher.start()                                  # inside the router's loop
    watcher.is_draining("http://10.0.0.5:8000")      # stop routing new work there
    watcher.handed_back("req-42")                    # the pending migration, or None
    await watcher.ack(["req-42"])                    # after re-issuing it elsewhere

The reference router (``python -m devstack.reference_router``, outside this package) is built
on it; the protocol is in docs/protocol.md. Only httpx is needed; nothing here imports the
coordinator or devstack.
"""

from router_client.watch import CoordinatorView, Watcher

__all__ = ["CoordinatorView", "Watcher"]
