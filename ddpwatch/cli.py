"""Command line: parse arguments and hand them to ddpwatch.commands. No logic here."""
from __future__ import annotations

import argparse
import sys

from . import __version__, errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="ddpwatch", description="Names the culprit when a distributed PyTorch run "
                                     "stops making progress.")
    parser.add_argument("--version", action="version", version=f"ddpwatch {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser("ranks", help="table of this node's ranks from their heartbeat records")
    p.add_argument("--dir", help="heartbeat directory (default: $DDPWATCH_DIR or /dev/shm/ddpwatch)")
    p.add_argument("--json", action="store_true", help='print {"ranks": [...]}')
    p.add_argument("--all", action="store_true", help="include records of finished runs")
    p.set_defaults(handler="ranks")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from importlib import import_module
    command = import_module(f"ddpwatch.commands.{args.handler}")
    try:
        return command.main(args)
    except errors.DdpwatchError as err:
        print(f"ddpwatch {args.command}: {err}", file=sys.stderr)
        return err.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return errors.OK


if __name__ == "__main__":
    sys.exit(main())
