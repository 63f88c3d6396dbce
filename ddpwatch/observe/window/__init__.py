"""Evidence over a window, between two snapshots: the ranks' thread states read
many times (duty.py), by the daemon between ticks (between.py), and stack dumps
taken in the window (window_stacks.py, `diagnose`)."""
