"""The coordinator as the engine's init (``shutdown-coordinator run -- ENGINE…``).

For pods without a sidecar and hosts without Kubernetes: the engine runs as this process's
child, the coordinator's API serves beside it, the runtime's stop signal runs the drain a
preStop hook would, and everything an init does is done too (orphans reaped, signals
passed on to the engine's main process, its exit status returned as this process's).

    server.run_engine     the whole run, from the subreaper to the exit code
    supervisor            the engine's lifecycle: signals, reaps, drain, what is left
    lifecycle             its states and moves (one table), exit statuses, forwarded signals
    engine_child          the engine's main process: started, signalled through a pidfd
    reaper                every exited child reaped in one place, its status kept for the
                          kill engine (``coordinator.kill.reaped``)
"""
