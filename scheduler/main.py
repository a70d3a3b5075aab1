"""`shmserve`: the root process (scheduler/root.py), and the scheduler process it starts.

The same command serves both: the root checks the command line (so a bad flag fails
at once, with the usage message) and starts `python -m scheduler.main` again with
SUPERVISED_ENV set, which makes that process the scheduler.
"""

from __future__ import annotations

import asyncio
import signal
import sys

from scheduler.cli import parse_args, warn_ignored
from scheduler.root import Root, supervised
from shm.lifecycle import die_with_parent
from shm.log import configure_logging


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    given = supervised()
    args = parse_args(argv)
    if given is None:
        configure_logging("root", args.log_settings)
        sys.exit(Root(argv).run())
    # kill -9 of the root leaves nobody to restart or stop this process: it goes at
    # once, and its children with it (they exit when their parent dies)
    die_with_parent(signal.SIGKILL, given["root"])
    configure_logging("scheduler", args.log_settings)
    if given["generation"] == 0:  # said once, not again after every restart
        warn_ignored(args)
    args.shm_prefix, args.run_dir = given["prefix"], given["run_dir"]
    from scheduler.server import Server

    async def run() -> int:
        return await Server(args).run()

    sys.exit(asyncio.run(run()))


if __name__ == "__main__":
    main()
