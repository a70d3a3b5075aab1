"""The scheduler process. At the top: its entry point (main.py), command line (cli.py),
loop (server.py) and what the loop owns (the schedulers' callbacks and the requests
it makes itself, settings calls, statistics, metrics, cache, trace, client regions, BLS
admission, log settings, the timer). In folders, one per job:
scheduling/ (model schedulers, batchers, rate limiter), repository/ (configs, models on
disk, load and unload), processes/ (root, supervision, frontend and worker pools) and
bench/ (the load generator, a client the server never imports)."""
