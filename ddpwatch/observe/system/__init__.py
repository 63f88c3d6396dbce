"""OS access the probes share: helper programs found once (programs.py), other
network namespaces entered (netns.py), files read through another process's root
without following its links (rootfile.py), and the kernel's process events
(proc_events.py)."""
