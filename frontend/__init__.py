"""Frontend processes: the HTTP/REST and gRPC protocol servers and their codecs."""

VERSION = "0.1.0"

# The Triton protocol extensions this server serves, in the order Triton 2.51 lists
# them.
EXTENSIONS = ("classification", "sequence", "model_repository",
              "model_repository(unload_dependents)", "schedule_policy", "model_configuration",
              "system_shared_memory", "cuda_shared_memory", "binary_tensor_data",
              "parameters", "statistics", "trace", "logging")
