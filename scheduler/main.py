"""`shmserve`: the root process (scheduler/processes/root.py), and the scheduler
process it starts.

The same command serves both: the root checks the command line (so a bad flag fails
at once, with the usage message) and starts `python -m scheduler.main` again with
SUPERVISED_ENV set, which makes that process the scheduler.
"""

from __future__ import annotations

import logging
import os
import signal
import sys


def main(argv: list[str] | None = None) -> None:
    # before the imports (a second or more on a busy machine): a stop sent meanwhile
    # is remembered, not a death by signal
    stopped: list[int] = []
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda signum, _frame: stopped.append(signum))

    from scheduler.cli import (apply_process_policy, parse_args, repository_problem,
                               warn_ignored)
    from scheduler.processes.root import STOP_SIGNALS, Root, supervised
    from shm.lifecycle import die_with_parent, run_loop
    from shm.log import configure_logging

    argv = sys.argv[1:] if argv is None else argv
    given = supervised()
    args = parse_args(argv)
    if given is None:
        configure_logging("root", args.log_settings)
        if stopped:
            sys.exit(0)  # stopped before anything started
        problem = repository_problem(args.model_repository)
        if problem:  # before any process or port: nothing would serve
            logging.getLogger("shmserve.root").error("error: %s", problem)
            sys.exit(1)
        if args.cpus:
            # every process of the server is a child of this one and inherits it
            os.sched_setaffinity(0, args.cpus)
        problem = apply_process_policy(args.process_policy)  # inherited as well
        if problem:
            logging.getLogger("shmserve.root").warning("%s", problem)
        # the scheduler's own stop takes at most about --exit-timeout-secs + 20 s
        # (drain, then bounded waits for every child); SHMSERVE_STOP_MARGIN_S shortens
        # the margin for the test that freezes a scheduler in its stop
        margin = float(os.environ.get("SHMSERVE_STOP_MARGIN_S", "30"))
        sys.exit(Root(argv, stop_grace=args.exit_timeout_secs + margin).run())
    # kill -9 of the root leaves nobody to restart or stop this process: it goes at
    # once, and its children with it (they exit when their parent dies)
    die_with_parent(signal.SIGKILL, given["root"])
    # a stop the root forwards before the server's loop handles signals (a restarted
    # scheduler still importing) is kept and honoured once it runs, not a death
    early: list = []  # [the Server] once it exists, [True] for a stop before that

    def stop_early(_signum, _frame) -> None:
        if early and early[0] is not True:
            early[0].request_stop()
        elif not early:
            early.append(True)

    for sig in STOP_SIGNALS:
        signal.signal(sig, stop_early)
    # the root started this process with them blocked: one sent meanwhile arrives now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
    configure_logging("scheduler", args.log_settings)
    if given["generation"] == 0:  # said once, not again after every restart
        warn_ignored(args)
    args.shm_prefix, args.run_dir = given["prefix"], given["run_dir"]
    args.state_dir = given.get("state_dir", "")
    from scheduler.server import Server

    async def run() -> int:
        server = Server(args)
        if early:
            server.request_stop()
        else:
            early.append(server)
        return await server.run()  # its loop takes the signals over from here

    sys.exit(run_loop(run()))


if __name__ == "__main__":
    from shm.lifecycle import run_main
    run_main(main, "scheduler")
