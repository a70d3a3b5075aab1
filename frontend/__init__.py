"""Frontend processes: the HTTP/REST and gRPC protocol servers and their codecs."""

VERSION = "0.1.0"

# Triton protocol extensions this server really serves; each later feature adds its own.
EXTENSIONS = ("binary_tensor_data", "model_configuration", "schedule_policy", "parameters",
              "system_shared_memory", "cuda_shared_memory", "statistics", "logging",
              "trace")
