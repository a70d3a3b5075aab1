"""The server's processes: the root that keeps the scheduler alive, and the supervisor
and pools that start, watch and restart the frontends and workers."""
