"""`shmserve`: the scheduler process, root of the server."""

from __future__ import annotations

import asyncio
import sys

from scheduler.cli import parse_args, warn_ignored
from shm.log import configure_logging


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    configure_logging("scheduler", args.log_settings)
    warn_ignored(args)
    from scheduler.server import Server

    async def run() -> int:
        return await Server(args).run()

    sys.exit(asyncio.run(run()))


if __name__ == "__main__":
    main()
