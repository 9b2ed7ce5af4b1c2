"""Numeric data formats: what a tensor element really costs in storage and which
compute unit class can operate on it.

Storage cost includes block scales: an OCP MX format stores one shared 8-bit
(E8M0) scale per block of 32 elements, NVFP4 one FP8 (E4M3) scale per block of
16 elements, and grouped INT4 one FP16 scale per group of 128 elements.

Sources:
- OCP Microscaling Formats (MX) Specification v1.0 (2023), Table 1: MXFP8/MXFP6/
  MXFP4/MXINT8 use block size 32 with an E8M0 (8-bit) shared scale.
- NVIDIA, "Introducing NVFP4 for Efficient and Accurate Low-Precision Inference"
  (developer blog, 2025): E2M1 values, one E4M3 scale per 16 values plus one FP32
  per-tensor scale (negligible, not counted).
- Grouped INT4 (GPTQ/AWQ style, group size 128, one FP16 scale per group).
- llama.cpp's GGUF quantizations (``q4_0`` ... ``q8_0``): the legacy types store blocks of 32
  weights with one FP16 scale (Q4_0: 4-bit weights, 4.5 bits a weight; Q8_0: 8.5), the K-quant mixes
  give most tensors a 256-weight super-block type and a few (attn_v, part of ffn_down, the output) a
  wider one, so their bits are a model's average: the llama.cpp ``tools/quantize/README.md`` table
  for meta-llama/Llama-3.1-8B (bits/weight: Q4_K_S 4.6672, Q4_K_M 4.8944, Q5_K_M 5.7036, Q6_K
  6.5633, Q8_0 8.5008; github.com/ggml-org/llama.cpp, commit 311c2c9f), taken as every model's.
  Their matrix products run on integer units (llama.cpp's MMQ kernels quantize the activations to
  8 bits and use int8 dot products), so they compute in the INT8 class, widening from there.
- MLX's affine quantization (``mlx-4bit``, ``mlx-8bit``): ``mlx.core.quantize`` defaults to groups
  of 64 weights, each with a scale and a bias in the weights' 16-bit type (MLX documentation,
  mlx.core.quantize): 4 + 32 / 64 = 4.5 bits a weight at 4 bits.
- Grouped sub-4-bit integers (INT3, INT2: GPTQ, Frantar et al., arXiv 2210.17323, Sec. 5, quantizes
  to 3 and 2 bits with grouping) and any group size: ``int<b>-g<N>`` (b in 2, 3, 4, 8; N a power of
  two from 16 to 1024) stores b bits per weight and one FP16 scale per N weights. No device
  computes 2- or 3-bit integers: they compute in the INT4 class (the narrowest integer class a
  device has), widening from there.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from basis.errors import DseError


@dataclass(frozen=True)
class DataFormat:
    """A storage/compute format.

    name: the user-facing name (``fp8``, ``mxfp4``, ...).
    element_bits: bits of one element's payload.
    block_size: elements that share one scale (0 = no block scale).
    scale_bits: bits of one block scale.
    compute: the compute class whose peak rate runs arithmetic on this format
        (``fp32``, ``bf16``, ``fp16``, ``fp8``, ``fp6``, ``fp4``, ``int8``, ``int4``).
    """

    name: str
    element_bits: float
    compute: str
    block_size: int = 0
    scale_bits: int = 0
    description: str = ""

    @property
    def bits(self) -> float:
        """Storage bits per element, block scales included."""
        if self.block_size:
            return self.element_bits + self.scale_bits / self.block_size
        return float(self.element_bits)

    @property
    def bytes(self) -> float:
        """Storage bytes per element, block scales included."""
        return self.bits / 8.0


FORMATS: dict[str, DataFormat] = {
    f.name: f
    for f in (
        DataFormat("fp32", 32, "fp32", description="IEEE binary32"),
        DataFormat("bf16", 16, "bf16", description="bfloat16 (E8M7)"),
        DataFormat("fp16", 16, "fp16", description="IEEE binary16 (E5M10)"),
        DataFormat("fp8", 8, "fp8", description="FP8 E4M3"),
        DataFormat("fp8-e5m2", 8, "fp8", description="FP8 E5M2"),
        DataFormat("fp6", 6, "fp6", description="FP6 (E3M2/E2M3), per-channel scales negligible"),
        DataFormat("fp4", 4, "fp4", description="FP4 E2M1, per-channel scales negligible"),
        DataFormat("int8", 8, "int8", description="INT8, per-channel scales negligible"),
        DataFormat("int4", 4, "int4", 128, 16, "INT4, group of 128 with one FP16 scale"),
        DataFormat("int3", 3, "int4", 128, 16, "INT3, group of 128 with one FP16 scale (computes as INT4)"),
        DataFormat("int2", 2, "int4", 128, 16, "INT2, group of 128 with one FP16 scale (computes as INT4)"),
        DataFormat("mxfp8", 8, "fp8", 32, 8, "OCP MXFP8 (E4M3), block 32, E8M0 scale"),
        DataFormat("mxfp6", 6, "fp6", 32, 8, "OCP MXFP6 (E3M2), block 32, E8M0 scale"),
        DataFormat("mxfp4", 4, "fp4", 32, 8, "OCP MXFP4 (E2M1), block 32, E8M0 scale"),
        DataFormat("mxint8", 8, "int8", 32, 8, "OCP MXINT8, block 32, E8M0 scale"),
        DataFormat("nvfp4", 4, "fp4", 16, 8, "NVFP4 (E2M1), block 16, FP8 E4M3 scale"),
        DataFormat("q4_0", 4, "int8", 32, 16, "GGUF Q4_0 (llama.cpp), block 32, FP16 scale"),
        DataFormat("q4_k_s", 4.6672, "int8", description="GGUF Q4_K_S mix, Llama-3.1-8B's average bits"),
        DataFormat("q4_k_m", 4.8944, "int8", description="GGUF Q4_K_M mix, Llama-3.1-8B's average bits"),
        DataFormat("q5_k_m", 5.7036, "int8", description="GGUF Q5_K_M mix, Llama-3.1-8B's average bits"),
        DataFormat("q6_k", 6.5633, "int8", description="GGUF Q6_K, Llama-3.1-8B's average bits (6.5625 a super-block)"),
        DataFormat("q8_0", 8, "int8", 32, 16, "GGUF Q8_0 (llama.cpp), block 32, FP16 scale"),
        DataFormat("mlx-4bit", 4, "int4", 64, 32, "MLX affine 4-bit, group 64, FP16 scale and bias"),
        DataFormat("mlx-8bit", 8, "int8", 64, 32, "MLX affine 8-bit, group 64, FP16 scale and bias"),
    )
}

#: Compute classes in the order the roofline understands them.
COMPUTE_CLASSES = ("fp32", "tf32", "bf16", "fp16", "fp8", "fp6", "fp4", "int8", "int4")

#: Width (bits) of each compute class, used to pick the wider operand of a matmul.
COMPUTE_BITS = {"fp32": 32, "tf32": 19, "bf16": 16, "fp16": 16, "fp8": 8, "fp6": 6,
                "fp4": 4, "int8": 8, "int4": 4}

#: When a device cannot compute a class natively, it runs on the first class in
#: this chain that it supports (the narrowest wider format): W4A16 does FP16 math.
WIDENING = {
    "int4": ("int4", "int8", "fp16", "bf16", "fp32"),
    "fp4": ("fp4", "fp6", "fp8", "fp16", "bf16", "fp32"),
    "fp6": ("fp6", "fp8", "fp16", "bf16", "fp32"),
    "int8": ("int8", "fp16", "bf16", "fp32"),
    "fp8": ("fp8", "fp16", "bf16", "fp32"),
    "fp16": ("fp16", "bf16", "fp32"),
    "bf16": ("bf16", "fp16", "fp32"),
    "tf32": ("tf32", "fp32"),
    "fp32": ("fp32",),
}


def widening_choice(native) -> np.ndarray:
    """The compute class that runs the work asking for each class: ``native`` is [..., C]
    peaks per ``COMPUTE_CLASSES`` (0 = not native); returns [..., C] indices into
    ``COMPUTE_CLASSES`` of the first native class of each class's ``WIDENING`` chain (the
    narrowest wider format), -1 where the chain has none."""
    native = np.asarray(native, dtype=float)
    used = np.full(native.shape, -1, dtype=np.int64)
    for j, c in enumerate(COMPUTE_CLASSES):
        for w in reversed(WIDENING[c]):            # narrowest last, so it wins
            k = COMPUTE_CLASSES.index(w)
            used[..., j] = np.where(native[..., k] > 0, k, used[..., j])
    return used


#: bits of a grouped integer format (``int<b>-g<N>``) and the group sizes allowed
GROUPED_BITS = (2, 3, 4, 8)
GROUP_SIZES = tuple(2**k for k in range(4, 11))
_GROUPED = re.compile(r"int([0-9]+)-g([0-9]+)")


def grouped_format(bits: int, group: int) -> DataFormat:
    """The integer format of ``bits`` bits per element and one FP16 scale per ``group`` elements."""
    compute = "int8" if bits == 8 else "int4"
    return DataFormat(f"int{bits}-g{group}", bits, compute, group, 16,
                      f"INT{bits}, group of {group} with one FP16 scale")


def get_format(name: str, what: str = "format") -> DataFormat:
    """Return the DataFormat called ``name`` (a listed one, or a grouped integer ``int<b>-g<N>``);
    raise DseError listing the valid names."""
    key = str(name).lower()
    if key in ("e4m3", "fp8-e4m3"):
        key = "fp8"
    if key in FORMATS:
        return FORMATS[key]
    m = _GROUPED.fullmatch(key)
    if m and int(m.group(1)) in GROUPED_BITS and int(m.group(2)) in GROUP_SIZES:
        return grouped_format(int(m.group(1)), int(m.group(2)))
    raise DseError(f"unknown {what} '{name}'; valid formats: {', '.join(FORMATS)}, or a grouped integer "
                   f"int<b>-g<N> (b: {', '.join(map(str, GROUPED_BITS))}; N: a power of two from "
                   f"{GROUP_SIZES[0]} to {GROUP_SIZES[-1]}, one FP16 scale per N)")


#: Bytes per element, at least, of the tensors an activation format never reaches: partial sums
#: reduced across devices (a tensor-parallel all-reduce, an MoE combine) and the residual stream a
#: pipeline stage hands to the next. An FP8 or INT8 model quantizes a GEMM's input inside the layer,
#: after the reduction; what goes between layers stays in the model's 16-bit dtype. vLLM's all-reduce
#: fusion pass (docs.vllm.ai, vllm.compilation.passes.fusion.allreduce_rms_fusion, retrieved
#: 2026-11-29: "input goes through allreduce first, always 16-bit"; its FP8 pattern is all_reduce ->
#: fused_add_rms_norm -> group_fp8_quant); vLLM's IntermediateTensors (vllm.sequence: "the hidden
#: states and residuals to be sent to the next stage"); DeepEP and DeepSeek's Day-6 post: FP8
#: dispatch, "combine transmissions use the BF16 format".
UNQUANTIZED_MIN_BYTES = 2.0


def unquantized_bytes(activations: DataFormat) -> float:
    """Bytes per element of a partial sum reduced across devices, or of the residual stream, when the
    activations are in ``activations``: its bytes, or ``UNQUANTIZED_MIN_BYTES`` if it is narrower."""
    return max(activations.bytes, UNQUANTIZED_MIN_BYTES)


def matmul_compute_class(a: DataFormat, b: DataFormat) -> str:
    """Compute class of a product of operands in formats ``a`` and ``b``: the wider one
    (ties go to ``a``, the activation side)."""
    if COMPUTE_BITS[b.compute] > COMPUTE_BITS[a.compute]:
        return b.compute
    return a.compute
