"""Worker processes: they load model instances and run the batches the scheduler sends."""
