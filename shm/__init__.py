"""What every shmserve process must agree on: datatypes, errors, tensor descriptors,
shared-memory arenas, framed channels and the messages that cross each boundary."""
