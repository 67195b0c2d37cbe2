"""Build step beside pyproject.toml (which holds everything else): the wheel's packages are
marssim's own plus the data packages of :mod:`marssim.data`, mapped onto the repository's
top-level ``topologies/``, ``traces/calibration/``, ``traces/collectives/``, ``traces/host-overheads/``,
``traces/requests/``, ``traces/published/``, ``traces/attention-kernels/`` and ``traces/moe-kernels/``.
Those directories stay where they are in the repository and still ship inside the wheel."""

from setuptools import find_packages, setup

DATA_PACKAGES = {"marssim.data.topologies": "topologies", "marssim.data.calibration": "traces/calibration",
                 "marssim.data.collectives": "traces/collectives", "marssim.data.host_overheads": "traces/host-overheads",
                 "marssim.data.requests": "traces/requests", "marssim.data.published": "traces/published",
                 "marssim.data.attention_kernels": "traces/attention-kernels",
                 "marssim.data.moe_kernels": "traces/moe-kernels"}

setup(
    packages=find_packages(include=["marssim", "marssim.*"]) + list(DATA_PACKAGES),
    package_dir=DATA_PACKAGES,
    package_data={"marssim": ["py.typed"], "marssim.data.topologies": ["*.yaml", "mappings/*.yaml"],
                  "marssim.data.calibration": ["*.csv"], "marssim.data.collectives": ["*.csv", "*.md"],
                  "marssim.data.host_overheads": ["*.csv"], "marssim.data.requests": ["*.csv", "README.md"],
                  "marssim.data.published": ["*.csv"], "marssim.data.attention_kernels": ["*.csv"],
                  "marssim.data.moe_kernels": ["*.csv"]},
)
