"""The load generator (`shmserve-bench`, scripts/bench): a client of any server that
speaks Triton's protocols. Nothing here is imported by the server's processes."""
