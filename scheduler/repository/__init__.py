"""Model repositories: configs, the models and versions on disk, the model manager's
load and unload, and the repository API's control (modes, poller, journal)."""
