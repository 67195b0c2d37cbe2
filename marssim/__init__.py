"""marssim: discrete-event simulation and mapping of DNN workloads on multi-accelerator systems.

The pipeline, left to right::

    System (YAML) + Graph (zoo / ONNX) + Mapping -> lower() -> TaskGraph -> simulate() -> Result
                                                                        \\-> estimate() -> Estimate
"""

__version__ = "0.1.0"
