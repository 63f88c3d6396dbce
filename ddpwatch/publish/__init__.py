"""Showing judgements to people and machines: the daemon's view, text and JSON
reports, /metrics, the HTTP server, incidents and their bundles, the peer view,
and alert webhooks (`alerts/`). A new exporter or webhook flavour goes here.

Imports judge and observe; nothing below imports it."""
