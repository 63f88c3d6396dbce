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
    p.add_argument("--dir", help="heartbeat directory (default: $DDPWATCH_DIR or /dev/shm/ddpwatch); "
                   "the ones running ranks name in their DDPWATCH_DIR are read too")
    p.add_argument("--json", action="store_true", help='print {"ranks": [...]}')
    p.add_argument("--all", action="store_true", help="include records of finished runs")
    p.set_defaults(handler="ranks")

    p = sub.add_parser("diagnose", help="judge every job on this node once (or the job of a "
                       "pid): culprit, evidence, remedy")
    p.add_argument("pid", nargs="?", type=int, help="any pid of the job: a rank, the torchrun "
                   "agent, or a spawn parent (default: every job on this node)")
    p.add_argument("--json", action="store_true", help="print {job, ranks[]} as JSON; "
                   'without a pid {"jobs": [...]}')
    p.add_argument("--all", action="store_true", help="without a pid: list the Python "
                   "processes seen too, and why each is no rank")
    p.add_argument("--watch", action="store_true", help="without a pid: a live view of the "
                   "node's jobs, judged again each second (plain lines when not a terminal)")
    p.add_argument("--replay", metavar="FILE", help="judge a saved snapshot history instead")
    p.add_argument("--save-snapshot", metavar="FILE", help="save what was observed as JSON")
    p.add_argument("--rules", metavar="FILE", action="append", help="add or override rules "
                   "(repeatable)")
    p.add_argument("--window", type=float, default=1.0, metavar="S",
                   help="seconds between the two samples (default 1.0)")
    p.add_argument("--syn-wait", type=float, default=35.0, metavar="S",
                   help="when ranks wait for peers that have not connected, watch this node's "
                   "interfaces up to S seconds for their connection attempts, to tell "
                   "whether this node drops them (root; default 35: peers retry up to "
                   "32 s apart; 0: do not wait)")
    p.add_argument("--no-stacks", action="store_true", help="do not run py-spy")
    p.add_argument("--native", action="store_true", help="native frames too (running ranks only)")
    p.add_argument("--dir", help="heartbeat directory (default: $DDPWATCH_DIR or /dev/shm/ddpwatch); "
                   "the ones running ranks name in their DDPWATCH_DIR are read too")
    p.add_argument("--peer", metavar="URL", action="append", default=[],
                   help="another node's daemon (http://HOST:PORT): judge with its ranks too, "
                   "as the daemon's peer view does (repeatable)")
    p.add_argument("--token-file", metavar="FILE", help="a file holding the token for --peer "
                   "(default: $DDPWATCH_TOKEN)")
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused: commands/token.py
    p.set_defaults(handler="diagnose_node")  # with a pid: commands/diagnose.py

    p = sub.add_parser("run", help="the per-node daemon: watch every rank, serve /metrics "
                       "and /status, send alerts")
    p.add_argument("--config", metavar="FILE", help="config file (default: $DDPWATCH_CONFIG, "
                   "then /etc/ddpwatch/config.yaml)")
    p.add_argument("--listen", metavar="ADDR:PORT", help="HTTP address (default 127.0.0.1:19500)")
    p.add_argument("--log-format", choices=("text", "json"))
    p.set_defaults(handler="run")

    p = sub.add_parser("status", help="the daemon's current view as a table")
    p.add_argument("--url", default="http://127.0.0.1:19500", help="daemon base URL")
    p.add_argument("--token-file", metavar="FILE", help="a file holding the daemon's token "
                   "(default: $DDPWATCH_TOKEN)")
    p.add_argument("--token", help=argparse.SUPPRESS)  # refused: commands/token.py
    p.add_argument("--json", action="store_true", help="print /status as it is")
    p.add_argument("--watch", action="store_true", help="a live view, read again each second "
                   "(plain lines when not a terminal)")
    p.set_defaults(handler="status")

    p = sub.add_parser("preflight", help="the network checklist before a multi-node launch: "
                       "run it on every node with the same --master")
    p.add_argument("--master", required=True, metavar="ADDR:PORT",
                   help="MASTER_ADDR:MASTER_PORT of the launch to come; the node holding ADDR "
                   "is the master")
    p.add_argument("--nodes", type=int, default=2, metavar="N", help="nodes taking part "
                   "(default 2)")
    p.add_argument("--params", type=int, metavar="N", help="model parameters: estimate the "
                   "all-reduce time per step over the measured link")
    p.add_argument("--wait", type=float, default=30.0, metavar="S", help="how long the master "
                   "waits for the workers, and they for it (default 30)")
    p.add_argument("--secret-file", metavar="FILE", help="the preflight secret, the same on "
                   "every node (default: $DDPWATCH_PREFLIGHT_SECRET); with it every message "
                   "is signed, and nobody without it can play master or take a worker's slot")
    p.add_argument("--json", action="store_true", help="print the checks as JSON")
    p.set_defaults(handler="preflight")

    p = sub.add_parser("report", help="an incident's page (HTML): drawn again from its bundle, "
                       "or from a saved snapshot history")
    p.add_argument("bundle", nargs="?", metavar="BUNDLE_DIR",
                   help="an incident bundle (<state_dir>/incidents/<id>/); the page is "
                   "written to BUNDLE_DIR/report.html unless -o says otherwise")
    p.add_argument("--replay", metavar="SNAPSHOT.json", help="judge a saved snapshot history "
                   "(diagnose --save-snapshot, or a bundle's snapshots.json) and draw its page "
                   "(to stdout unless -o)")
    p.add_argument("-o", "--output", metavar="FILE", help="where to write the page ('-': stdout)")
    p.add_argument("--rules", metavar="FILE", action="append", help="with --replay: add or "
                   "override rules (repeatable)")
    p.set_defaults(handler="report")

    p = sub.add_parser("exec", help="run a launch command with heartbeats in every rank, no "
                       "edit to the script: ddpwatch exec -- torchrun --nproc_per_node=2 train.py")
    p.add_argument("--dir", help="heartbeat directory for the ranks (sets DDPWATCH_DIR)")
    p.add_argument("launch", nargs=argparse.REMAINDER, metavar="-- COMMAND ...",
                   help="the launch command (torchrun, python, accelerate launch, srun...)")
    p.set_defaults(handler="exec")

    p = sub.add_parser("rules", help="work with rule files")
    rules_sub = p.add_subparsers(dest="rules_command", metavar="SUBCOMMAND")
    rules_sub.required = True
    c = rules_sub.add_parser("check", help="validate rule files (default: the shipped rules)")
    c.add_argument("files", nargs="*", metavar="FILE")
    c.set_defaults(handler="rules_check")
    c = rules_sub.add_parser("signals", help="list the signals rules can name: family, type, "
                             "unit, meaning")
    c.add_argument("names", nargs="*", metavar="NAME", help="only these signals")
    c.add_argument("--family", help="only the signals of this family (process, stack, "
                   "peers...)")
    c.add_argument("--json", action="store_true", help='print {"signals": [...], "units": {...}}')
    c.set_defaults(handler="rules_signals")
    c = rules_sub.add_parser("doc", help="print the reference of every rule and signal "
                             "(docs/rules.md), with the replay fixtures each rule decides in")
    c.add_argument("--fixtures", metavar="DIR", help="replay fixtures (default: the source "
                   "checkout's tests/fixtures/snapshots)")
    c.set_defaults(handler="rules_doc")
    c = rules_sub.add_parser("explain", help="one rule: its stage and place in the order, "
                             "description, conditions, the fixtures it decides in, what "
                             "overrides it (exit 67: no such rule)")
    c.add_argument("id", metavar="ID", help="a rule's id (rules/default.yaml, or a --rules "
                   "file's)")
    c.add_argument("--rules", metavar="FILE", action="append", help="with these rule files on "
                   "top of the shipped ones, as diagnose --rules loads them (repeatable)")
    c.add_argument("--fixtures", metavar="DIR", help="replay fixtures (default: the source "
                   "checkout's tests/fixtures/snapshots)")
    c.add_argument("--json", action="store_true", help="print it as JSON")
    c.set_defaults(handler="rules_explain")
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
