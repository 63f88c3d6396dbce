"""Reading the world: discovery (which processes make up a job), the probes
(one per module under `probes/`, registered by name), and the frozen Snapshot
they fill. A new probe is a file in `probes/` plus its registration.

Imports `ddpwatch.heartbeat` (to read records) and the base modules; never
judge or publish."""
