"""Accelerator designs: the configurations an accelerator can take (dataflow, PE array, buffers).

A design is a validated, immutable value. Its dataflow decides which cost model times an op on it
(``marssim.cost``). The library of designs lives in each system file under ``designs:``.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from marssim import units

from .buffers import Buffers
from .energy_tables import ENERGY_TABLES, table_energy
from .quantities import Bandwidth, Bytes, FlopRate, Hertz, Joules, PeCount, Seconds, SmCount, TileSize, Watts

__all__ = ["Design", "DesignEnergy", "GpuSpec", "DATAFLOWS", "SYSTOLIC_DATAFLOWS"]

_ALIASES = {
    "output_stationary": "os",
    "weight_stationary": "ws",
    "input_stationary": "is",
    "row_stationary": "rs",
    "eyeriss": "rs",
    "nvdla_like": "nvdla",
    "shidiannao_like": "shidiannao",
}

DATAFLOWS = ("os", "ws", "is", "rs", "nvdla", "shidiannao", "gpu")
"""Dataflow codes: systolic output/weight/input-stationary, Eyeriss row-stationary, NVDLA-like
C/K-parallel, ShiDianNao-like output-pixel-parallel, and GPU-class (roofline + efficiency curves)."""

SYSTOLIC_DATAFLOWS = ("os", "ws", "is")

Dataflow = Literal["os", "ws", "is", "rs", "nvdla", "shidiannao", "gpu"]

_STRICT = ConfigDict(extra="forbid", frozen=True)


class DesignEnergy(BaseModel):
    """Energy figures of a design, in joules per event and watts. ``sram_read_byte`` /
    ``sram_write_byte`` / ``dram_read_byte`` / ``dram_write_byte`` default to ``sram_byte`` and
    ``dram_byte``; ``source`` says where the figures come from."""

    model_config = _STRICT
    mac: Joules = Field(description="energy per multiply-accumulate, J")
    sram_byte: Joules = Field(0.0, description="energy per byte moved to/from the on-chip buffer, J")
    dram_byte: Joules = Field(0.0, description="energy per byte moved to/from off-chip memory, J")
    static_power: Watts = Field(0.0, description="leakage/idle power while the design is configured, W")
    sram_read_byte: Joules | None = Field(None, description="energy per byte read from the on-chip buffer, J")
    sram_write_byte: Joules | None = Field(None, description="energy per byte written to the on-chip buffer, J")
    dram_read_byte: Joules | None = Field(None, description="energy per byte read from off-chip memory, J")
    dram_write_byte: Joules | None = Field(None, description="energy per byte written to off-chip memory, J")
    source: str = Field("", description="where the figures come from")
    table: str | None = Field(None, description="a named table of published figures "
                                                "(marssim.system.energy_tables) the other fields override")

    @field_validator("table")
    @classmethod
    def _known_table(cls, value: str | None) -> str | None:
        if value is not None and value not in ENERGY_TABLES:
            raise ValueError(f"unknown energy table {value!r}; expected one of {', '.join(ENERGY_TABLES)}")
        return value

    @property
    def per_byte(self) -> tuple[float, float, float, float]:
        """(SRAM read, SRAM write, DRAM read, DRAM write) joules per byte."""
        def pick(value: float | None, default: float) -> float:
            return float(default if value is None else value)

        return (pick(self.sram_read_byte, self.sram_byte), pick(self.sram_write_byte, self.sram_byte),
                pick(self.dram_read_byte, self.dram_byte), pick(self.dram_write_byte, self.dram_byte))


class GpuSpec(BaseModel):
    """GPU-class parameters: SM count and peak throughput per data type; the calibration table
    (``calibration``, a device name) and the software stack (``stack``) its kernel timings come from."""

    model_config = _STRICT
    sms: SmCount = Field(description="streaming multiprocessors")
    peak_flops: dict[str, FlopRate] = Field(description="dense peak FLOP/s per dtype (fp32, tf32, fp16, bf16, fp8, int8)")
    l2: Bytes | None = Field(None, description="L2 cache size, bytes")
    tile_m: TileSize = Field(128, description="GEMM thread-block tile rows used for padding/wave quantisation")
    tile_n: TileSize = Field(128, description="GEMM thread-block tile columns")
    launch_overhead: Seconds = Field(3e-6, description="per-kernel launch overhead, s (\"3 us\")")
    calibration: str | None = Field(
        None, description="device name of a calibration table in traces/calibration/ to use when present"
    )
    compute_capability: float | None = Field(
        None, description="CUDA compute capability (8.0 A100, 9.0 H100): which generation's constants NCCL's tuning uses")
    nvlinks: int | None = Field(None, ge=0, le=64, description="NVLink links per GPU (12 on A100, 18 on H100)")
    stack: str | None = Field(
        None, description="the software stack this design models (a calibration table's `stack` column, e.g. "
                          "\"vidur-2024\"): only rows measured on it (or of unknown stack) time its kernels; "
                          "none: every row of the table"
    )
    collective_stack: str | None = Field(
        None, description="the software stack whose measured collectives (a `stack` of traces/collectives/, e.g. "
                          "\"nccl-2.29.2\") time this design's collectives (marssim.collectives.plan); none: `stack`'s")
    fallback_stacks: list[str] = Field(
        default_factory=list,
        description="software stacks whose kernel rows time the kernel families (kind, dtype, attention backend) "
                    "that `stack` did not measure, the first that did (e.g. an engine's FP8 GEMMs beside a "
                    "PyTorch harness's bf16 ones); empty names are ignored")

    attention_kernels: str | None = Field(
        None, description="a kernel set of traces/attention-kernels/ (e.g. \"pytorch-24.03-h200\": FlashAttention-2 and "
                          "cuDNN 9.1 as that container ran them) whose published rates time this design's causal prompt "
                          "attention kernels, forward and backward, in place of the engines' measured ones "
                          "(marssim.cost.attention_kernels); empty: the measured grid")

    @field_validator("attention_kernels")
    @classmethod
    def _known_kernel_set(cls, value: str | None) -> str | None:
        if not value:
            return None
        from marssim.data import attention_kernels

        names = sorted(p.stem for p in attention_kernels().glob("*.csv"))
        if value not in names:
            raise ValueError(f"unknown attention kernel set {value!r}; expected one of {', '.join(names)}")
        return value

    @field_validator("peak_flops")
    @classmethod
    def _non_empty(cls, value: dict[str, float]) -> dict[str, float]:
        if not value:
            raise ValueError("expected at least one dtype with its peak FLOP/s, like {bf16: 989 TFLOP/s}")
        return value


class Design(BaseModel):
    """One accelerator design. Units: Hz, bytes, bytes/s; energy in J.

    ``pe_rows x pe_cols`` is the MAC array (for ``nvdla``: atomic-K x atomic-C lanes; for
    ``shidiannao``: output-pixel rows x columns; for ``rs``: Eyeriss PE rows x columns). The
    on-chip buffer (``sram``) feeds the array at ``sram_bandwidth``; off-chip traffic is bounded by
    ``dram_bandwidth``, which, when omitted, is the bandwidth of the memory of the accelerator
    that takes this design. ``buffers`` (:class:`~marssim.system.buffers.Buffers`) splits the
    buffer per operand and sets double buffering, DRAM latency and channels; without it ``sram``
    is one shared, double-buffered buffer. With per-operand sizes, ``sram`` may be omitted (it is
    their sum).
    """

    model_config = _STRICT
    name: str
    dataflow: Dataflow
    pe_rows: PeCount = 0
    pe_cols: PeCount = 0
    clock: Hertz | None = Field(None, validate_default=True,
                                description="clock, Hz (required but for gpu designs, whose peaks are given per "
                                            "dtype and which may omit it where it is not published)")
    sram: Bytes = Field(description="on-chip global buffer, bytes")
    sram_bandwidth: Bandwidth | None = Field(None, validate_default=True,
                                             description="on-chip buffer bandwidth, bytes/s (required but for gpu "
                                                         "designs, whose cost formulas do not read it)")
    dram_bandwidth: Bandwidth | None = Field(None, description="off-chip bandwidth, bytes/s (default: the accelerator's memory)")
    energy: DesignEnergy | None = None
    buffers: Buffers | None = None
    gpu: GpuSpec | None = None
    description: str = ""

    @model_validator(mode="before")
    @classmethod
    def _derived_fields(cls, data: object) -> object:
        """``sram`` from per-operand buffer sizes when omitted; energy fields from a named table."""
        if not isinstance(data, dict):
            return data
        buffers = data.get("buffers") if isinstance(data.get("buffers"), dict) else {}
        sizes = None
        try:
            sizes = [units.parse(buffers[op], "bytes") for op in ("ifmap", "filter", "ofmap")]
        except (KeyError, TypeError, units.UnitError):
            pass  # no sizes, or bad ones: the field validators report what is wrong
        if data.get("sram") is None and sizes is not None:
            data = {**data, "sram": f"{sum(sizes)!r} B"}  # derived values carry their unit, as in a file
        energy = data.get("energy")
        if isinstance(energy, dict) and energy.get("table") in ENERGY_TABLES:
            try:
                sram = units.parse(data.get("sram"), "bytes")
                split = buffers.get("split")
                largest = max(sizes) if sizes else max(split.values()) * sram if isinstance(split, dict) else sram
            except (TypeError, ValueError, AttributeError, units.UnitError):
                largest = None  # the size is reported elsewhere; the table's other figures still apply
            table = table_energy(energy["table"], largest if largest is not None else 8192.0)
            if largest is None:
                table = {k: v for k, v in table.items() if not k.startswith("sram")}
            table = {k: f"{v!r} J" if isinstance(v, float) else v for k, v in table.items()}
            for base in ("sram", "dram"):  # a figure given beside the table replaces its read and write ones
                if f"{base}_byte" in energy:
                    table = {k: v for k, v in table.items() if k not in (f"{base}_read_byte", f"{base}_write_byte")}
            data = {**data, "energy": {**table, **energy}}
        return data

    @field_validator("clock", "sram_bandwidth")
    @classmethod
    def _required_but_for_gpus(cls, value: float | None, info: ValidationInfo) -> float | None:
        dataflow = info.data.get("dataflow")
        if value is None and dataflow is not None and dataflow != "gpu":
            raise ValueError(f"missing required key (dataflow {dataflow!r} needs it; only gpu designs may omit it)")
        return value

    @field_validator("dataflow", mode="before")
    @classmethod
    def _alias(cls, value: object) -> object:
        if isinstance(value, str):
            key = value.strip().lower().replace("-", "_")
            return _ALIASES.get(key, key)
        return value

    @model_validator(mode="after")
    def _shape(self) -> "Design":
        if self.dataflow == "gpu":
            if self.gpu is None:
                raise ValueError("a design with dataflow 'gpu' needs a 'gpu:' section (sms, peak_flops)")
        elif self.pe_rows <= 0 or self.pe_cols <= 0:
            raise ValueError(f"dataflow {self.dataflow!r} needs positive pe_rows and pe_cols")
        sizes = self.buffers.sizes if self.buffers is not None else None
        if sizes is not None and sum(sizes) > self.sram * (1 + 1e-9):
            raise ValueError(f"the buffers ({sum(sizes):.6g} bytes) exceed sram ({self.sram:.6g} bytes)")
        return self

    @property
    def pes(self) -> int:
        """Number of processing elements (MAC units)."""
        return self.pe_rows * self.pe_cols

    @property
    def peak_macs_per_s(self) -> float:
        """Peak MAC/s of the array (for GPUs: half the best dense peak FLOP/s)."""
        if self.gpu is not None:
            return max(self.gpu.peak_flops.values()) / 2.0
        return self.pes * (self.clock or 0.0)

    def with_dram_bandwidth(self, bandwidth: float) -> "Design":
        """This design with ``dram_bandwidth`` bounded by ``bandwidth`` (bytes/s)."""
        current = self.dram_bandwidth
        value = bandwidth if current is None else min(current, bandwidth)
        return self.model_copy(update={"dram_bandwidth": value})
