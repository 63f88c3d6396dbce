"""Finding jobs: which processes are ranks of which job (discovery.py by launcher
and environment, tcp_discovery.py by their TCP connections, launchers.py the
launchers' conventions over ddpwatch/launchers.py's table), and ranks that ended
while watched (departures.py). `Job` (job.py) is what they make."""
