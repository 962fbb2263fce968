"""The sandbox: engine, per-invocation guest memory, the invocation runtime, the linker (capability set), traps,
watchdog, declarations, capabilities, and the queue. The engine knows nothing of crabtalk."""
