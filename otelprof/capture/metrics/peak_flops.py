"""Dense peak FLOP/s of current NVIDIA and AMD accelerators, by device name and matmul dtype:
the denominator of model FLOPs utilisation (``mfu.py``).

Every figure is the vendor's dense (no structured sparsity) tensor/matrix peak at boost clock;
where a datasheet gives only the 2:4-sparsity figure (marked ``*`` there) it is halved. FP32 is
the non-tensor (or, on AMD, the matrix) rate; ``tf32`` is what an FP32 matmul runs at when torch
allows TF32 (``torch.backends.cuda.matmul.allow_tf32``). Sources, the vendors' datasheets:

- A100: "NVIDIA A100 Tensor Core GPU" datasheet (SXM4 and PCIe give the same peaks).
- H100 SXM / PCIe / NVL: "NVIDIA H100 Tensor Core GPU" datasheet (sparse TF32/BF16/FP16/FP8
  figures halved). GH200: "NVIDIA GH200 Grace Hopper Superchip" datasheet (H100 SXM's peaks).
- H200 / H200 NVL: "NVIDIA H200 Tensor Core GPU" datasheet (same compute as H100 SXM / NVL).
- B200: "NVIDIA HGX B200" datasheet, per GPU (HGX B200 8-GPU figures / 8, sparse halved).
- L4: "NVIDIA L4 Tensor Core GPU" datasheet. L40S: "NVIDIA L40S" datasheet (its dense column).
- A10: "NVIDIA A10 Tensor Core GPU" datasheet. A10G (AWS G5 only; NVIDIA publishes no
  datasheet): AWS's G5 figures (31.52 FP32, 35 TF32, 70 FP16/BF16 dense TFLOPS).
- V100 SXM2 / PCIe / V100S: "NVIDIA V100 Tensor Core GPU" datasheet (tensor = FP16).
- MI250X / MI250: "AMD Instinct MI250X" and "MI250" datasheets (FP64/FP32 matrix, FP16/BF16).
- MI300X: "AMD Instinct MI300X" datasheet. MI325X: "AMD Instinct MI325X" datasheet (the same
  compute as MI300X).

A dtype a part has no entry for (BF16 on V100, FP8 before Hopper) has no peak: no MFU then.
"""

from __future__ import annotations

import re

T = 1e12

#: part -> dtype -> dense peak FLOP/s
PEAKS: dict[str, dict[str, float]] = {
    "A100": {"fp64": 19.5 * T, "fp32": 19.5 * T, "tf32": 156 * T, "bf16": 312 * T, "fp16": 312 * T},
    "H100 SXM": {
        "fp64": 67 * T,
        "fp32": 67 * T,
        "tf32": 494.5 * T,
        "bf16": 989.5 * T,
        "fp16": 989.5 * T,
        "fp8": 1979 * T,
    },
    "H100 PCIe": {
        "fp64": 51 * T,
        "fp32": 51 * T,
        "tf32": 378 * T,
        "bf16": 756.5 * T,
        "fp16": 756.5 * T,
        "fp8": 1513 * T,
    },
    "H100 NVL": {
        "fp64": 60 * T,
        "fp32": 60 * T,
        "tf32": 417.5 * T,
        "bf16": 835.5 * T,
        "fp16": 835.5 * T,
        "fp8": 1670.5 * T,
    },
    "B200": {"fp64": 37 * T, "fp32": 75 * T, "tf32": 1100 * T, "bf16": 2250 * T, "fp16": 2250 * T, "fp8": 4500 * T},
    "L4": {"fp32": 30.3 * T, "tf32": 60 * T, "bf16": 121 * T, "fp16": 121 * T, "fp8": 242.5 * T},
    "L40S": {"fp32": 91.6 * T, "tf32": 183 * T, "bf16": 362.05 * T, "fp16": 362.05 * T, "fp8": 733 * T},
    "A10": {"fp32": 31.2 * T, "tf32": 62.5 * T, "bf16": 125 * T, "fp16": 125 * T},
    "A10G": {"fp32": 31.52 * T, "tf32": 35 * T, "bf16": 70 * T, "fp16": 70 * T},
    "V100 SXM2": {"fp64": 7.8 * T, "fp32": 15.7 * T, "fp16": 125 * T},
    "V100 PCIe": {"fp64": 7 * T, "fp32": 14 * T, "fp16": 112 * T},
    "V100S PCIe": {"fp64": 8.2 * T, "fp32": 16.4 * T, "fp16": 130 * T},
    "MI250X": {"fp64": 95.7 * T, "fp32": 95.7 * T, "bf16": 383 * T, "fp16": 383 * T},
    "MI250": {"fp64": 90.5 * T, "fp32": 90.5 * T, "bf16": 362.1 * T, "fp16": 362.1 * T},
    "MI300X": {
        "fp64": 163.4 * T,
        "fp32": 163.4 * T,
        "tf32": 653.7 * T,
        "bf16": 1307.4 * T,
        "fp16": 1307.4 * T,
        "fp8": 2614.9 * T,
    },
}
PEAKS["H200"] = PEAKS["GH200"] = PEAKS["H100 SXM"]
PEAKS["H200 NVL"] = PEAKS["H100 NVL"]
PEAKS["MI325X"] = PEAKS["MI300X"]

#: (tokens all in the name, part), first match wins: the specific names before the general.
#: ROCm names an MI250X "AMD Instinct MI250X/MI250", hence MI250X before MI250.
_RULES: tuple[tuple[tuple[str, ...], str], ...] = (
    (("gh200",), "GH200"),
    (("h200", "nvl"), "H200 NVL"),
    (("h200",), "H200"),
    (("h100", "nvl"), "H100 NVL"),
    (("h100", "pcie"), "H100 PCIe"),
    (("h100",), "H100 SXM"),  # "NVIDIA H100 80GB HBM3"
    (("b200",), "B200"),
    (("a100",), "A100"),
    (("l40s",), "L40S"),
    (("l4",), "L4"),
    (("a10g",), "A10G"),
    (("a10",), "A10"),
    (("v100s",), "V100S PCIe"),
    (("v100", "pcie"), "V100 PCIe"),
    (("v100",), "V100 SXM2"),
    (("mi325x",), "MI325X"),
    (("mi300x",), "MI300X"),
    (("mi250x",), "MI250X"),
    (("mi250",), "MI250"),
)

#: torch's input type names (``KinetoEvent.dtypes()``) -> the table's dtypes
DTYPES = {
    "double": "fp64",
    "float": "fp32",
    "c10::Half": "fp16",
    "c10::BFloat16": "bf16",
    "c10::Float8_e4m3fn": "fp8",
    "c10::Float8_e5m2": "fp8",
    "c10::Float8_e4m3fnuz": "fp8",
    "c10::Float8_e5m2fnuz": "fp8",
}


def part(device_name: str) -> str | None:
    """The table's part for a ``torch.cuda.get_device_name()`` string, or None. Tokens are the
    name's runs of letters and digits, so "GB200" is no B200 and "L40S" no L4."""
    tokens = set(re.findall(r"[a-z0-9]+", device_name.lower()))
    for wanted, name in _RULES:
        if all(w in tokens for w in wanted):
            return name
    return None


def peak_flops(device_name: str, dtype: str | None) -> float | None:
    """The dense peak FLOP/s of ``device_name`` at ``dtype`` (the table's keys), or None."""
    name = part(device_name)
    if name is None or dtype is None:
        return None
    return PEAKS[name].get(dtype)
