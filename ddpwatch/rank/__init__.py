"""Everything that runs inside a training process: `instrument()` wraps the
torch.distributed collectives and DDP's gradient buckets, and writes the
heartbeat record (ddpwatch.heartbeat). The only stage that imports torch.

Imports only `ddpwatch.heartbeat` and the base modules (errors, codec, and
launchers: the table of launchers' conventions, for identity.py)."""
