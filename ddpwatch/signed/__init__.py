"""How ddpwatch's daemons and clients speak over HTTP (docs/architecture.md "Who
may speak for the daemon"): requests signed with the shared token and answers
proven by it (auth.py), and the client every reader of a daemon uses
(client.py: `ddpwatch status`, the peer view, `diagnose --peer`). Below every
stage: the peer view (observe/peers.py) asks with it, the server
(publish/endpoints.py) checks with it."""
