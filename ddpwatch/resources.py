"""Where the files ddpwatch ships (default rules, Grafana dashboards) are.

In a source checkout they sit at the top of the repo; an installed wheel puts
them under <prefix>/share/ddpwatch (setup.cfg's data_files).
"""
from __future__ import annotations

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def shipped(kind: str, name: str) -> str:
    """Path of a shipped file, e.g. shipped("rules", "default.yaml")."""
    candidates = (
        os.path.join(os.path.dirname(_HERE), kind, name),          # source checkout
        os.path.join(sys.prefix, "share", "ddpwatch", kind, name),  # wheel install
        os.path.join(sys.base_prefix, "share", "ddpwatch", kind, name),
    )
    for path in candidates:
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(f"shipped file {kind}/{name} not found (looked in "
                            f"{', '.join(candidates)})")
