"""``python -m repro.lab COMMAND``: the classroom's commands (explore)."""
import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    p = argparse.ArgumentParser(prog="python -m repro.lab")
    p.add_argument("command", choices=["explore"], help="explore: the staleness explorer in a browser")
    args, rest = p.parse_known_args(argv[:1])
    from repro.lab import explore
    return explore.main(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
