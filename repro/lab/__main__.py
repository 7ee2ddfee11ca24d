"""``python -m repro.lab``: the staleness classroom's commands, ``grade FILE`` and ``explore``.
Answered without importing torch until a file is graded (``--help`` is instant)."""
from __future__ import annotations

import argparse
import os
import signal
import sys

EXERCISES_HELP = """\
exercises (exercises/ in the checkout; each stub names its own in a line EXERCISE = "NAME"):
  mean_staleness   the mean staleness of N equally fast clients (a number)
  stable_lr        the largest stable learning rate at staleness tau (a number)
  sync_ratio       sync's throughput over async's under exponential step times (a number)
  staleness_rule   a staleness-scaled server rule (a class in the RULES registry)
  ssp_gate         the gate of stale synchronous parallel (a class in the PROTOCOLS registry)
  ringmaster       Ringmaster's discard rule (a class in the PROTOCOLS registry)
  backup_workers   backup workers for a sync round (a class in the PROTOCOLS registry)

exit status: 0 every check passed; 1 a check failed (each failure prints what was expected,
what came out and a hint); 2 the file cannot be loaded, or it ended the grading itself
(os._exit(), a crash): the reason in one line."""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["explore"]:   # the explorer owns its options (--port, --bench, --help)
        from repro.lab import explore
        return explore.main(argv[1:])
    p = argparse.ArgumentParser(prog="python -m repro.lab", description="The staleness classroom: "
                                "exercises that grade themselves, e.g. python -m repro.lab grade "
                                "exercises/01_mean_staleness.py, and an explorer with sliders in "
                                "the browser, python -m repro.lab explore", epilog=EXERCISES_HELP,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = p.add_subparsers(dest="command", metavar="COMMAND")
    grading = commands.add_parser("grade", help="grade an exercise file", epilog=EXERCISES_HELP,
                                  formatter_class=argparse.RawDescriptionHelpFormatter,
                                  description="Run the file's answer on fixed seeds against the "
                                  "package's reference and the published prediction, and print "
                                  "each check's verdict.")
    grading.add_argument("file", metavar="FILE", help="the exercise file, e.g. exercises/01_mean_staleness.py")
    commands.add_parser("explore", add_help=False,
                        help="the staleness explorer: sliders in a browser on 127.0.0.1 "
                             "(python -m repro.lab explore --help for its options)")
    args = p.parse_args(argv)
    if args.command != "grade":
        p.error("say what to do: grade FILE or explore (python -m repro.lab --help)")   # exits 2
    from repro.lab.grader import grade, grade_apart
    if hasattr(signal, "SIGPIPE"):   # grade FILE | head: end quietly as a Unix tool does (no sockets here)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    return (grade_apart if hasattr(os, "fork") else grade)(args.file)   # no fork on Windows


if __name__ == "__main__":
    sys.exit(main())
