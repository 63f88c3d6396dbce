"""`ddpwatch preflight`: the network checklist run on every node before a
multi-node launch (docs/design.md "The network checklist").

facts.py gathers what this node can say about itself (read, then pure
parsers); holder.py names the process holding a port; probe.py connects to a
peer's port and tells open / refused / dropped apart, and measures the link;
protocol.py frames, validates and signs what crosses the network (hostile input);
exchange.py runs the master's and the workers' side of the meeting;
checks.py turns everyone's facts into pass/fail/warn rows (pure); render.py
prints them.
"""
