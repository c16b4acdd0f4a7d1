"""The mlplcode command line."""
import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="mlplcode", description="A coding agent small enough to understand."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser(
        "demo", help="replay the example run through the agent loop",
        description="Replay the committed example run through the agent loop.",
    )
    args = parser.parse_args(argv)
    if args.command == "demo":
        print("mlplcode demo: the agent loop is not written yet; "
              "this command will replay the example run once it is.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
