"""The open fault benchmark (benchmarks/faults.py): a catalogue of scenarios as
data (benchmarks/faults.yaml), a runner that puts real jobs into each state from
outside, a scorer and a report. Modules, in the order data flows:
catalogue (read and expand the YAML), jobs (start a real job, find its ranks),
inject (the faults, and the check that each was reached), watch (one
`ddpwatch run`, its webhook receiver and /status), runner (one scenario), score
(pure), report (Markdown, HTML)."""
