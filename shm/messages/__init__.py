"""Message declarations, one module per process boundary. Structs only, no logic.

- `frontend`: frontend <-> scheduler (requests in, model state out, control).
- `worker`: scheduler <-> worker (instances, batches).
- `results`: whoever ran a request -> whoever asked (responses), and buffer releases.
- `repository`: the model-repository extension's calls (index, load, unload).
- `settings`: the logging and trace extensions' calls, and the log settings every
  process applies.

Each inbox decodes a fixed union of these (see the `*_INBOX` tuples); a message of any
other type is a protocol error.
"""
