"""Judging a snapshot history: signals measured from snapshots, the YAML rules
that combine them, and `classify.judge`, a pure function from snapshots to
verdicts. A new verdict is a vocabulary line plus its rules.

Imports observe (snapshots) and heartbeat (records); never publish."""
