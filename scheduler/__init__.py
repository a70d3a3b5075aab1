"""The scheduler process: CLI, supervision, model repository, batchers and statistics."""
