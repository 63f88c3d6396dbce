"""Exporters only read the daemon's latest DaemonView (ddpwatch.view): /metrics
(metrics.py), and whatever else shows the verdicts to people and machines."""
