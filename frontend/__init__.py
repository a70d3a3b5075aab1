"""Frontend processes: the HTTP/REST and gRPC protocol servers and their codecs."""

VERSION = "0.1.0"

# The Triton protocol extensions this server serves, in the order Triton 2.51 lists
# them; "sequence" and "model_repository" join when their issues land.
EXTENSIONS = ("classification", "schedule_policy", "model_configuration",
              "system_shared_memory", "cuda_shared_memory", "binary_tensor_data",
              "parameters", "statistics", "trace", "logging")
