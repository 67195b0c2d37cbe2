"""Built-in workloads. Each module registers its models with :func:`marssim.workload.register`."""
