"""Model schedulers: the interface the loop drives them through, the factory, which
queued requests form a batch (the batchers) and which instance runs it (the rate
limiter)."""
