"""The python backend: Triton's `triton_python_backend_utils` API and the model.py runner."""
