"""Hardware catalog: canonical accelerator names, peak dense FLOPs per precision, memory, links;
and the one precision normaliser. Standard library only.

Every entry cites the vendor document its figures come from. Peaks are *dense* (no 2:4
sparsity), per accelerator, in TFLOP/s; memory is the nominal HBM capacity in GiB-as-marketed
(vendors quote GB; the difference from GiB is inside the memory model's headroom).

`canonical_gpu_type("H100 80GB HBM3 (700W)")` -> "H100-SXM-80GB"; unknown names return None so that
callers can store the reported string and say the MFU could not be derived.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Accelerator:
    """One catalog entry.

    name: canonical gpu_type stored in runs; peak_tflops: dense TFLOP/s per precision key
    (bf16, fp16, fp8, fp4, tf32, fp32); memory_gib: HBM per accelerator; source: where the numbers are from.
    """

    name: str
    memory_gib: float
    peak_tflops: dict[str, float]
    source: str
    vendor: str = "NVIDIA"
    patterns: tuple[str, ...] = field(default=())

    @property
    def nvlink_gb_s(self) -> float:
        """Scale-up (intra-node) bandwidth per GPU and direction, GB/s (LINKS)."""
        return LINKS[self.name][0]

    @property
    def network_gb_s(self) -> float:
        """Scale-out (inter-node) bandwidth per GPU and direction, GB/s (LINKS)."""
        return LINKS[self.name][1]

    @property
    def links_source(self) -> str:
        return LINKS[self.name][2]


CATALOG: tuple[Accelerator, ...] = (
    Accelerator(
        "GB300", 288.0, {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "fp4": 15000.0, "tf32": 1250.0},
        "NVIDIA GB300 NVL72 datasheet (per-GPU = rack figure / 72, dense)",
        patterns=(r"gb300",),
    ),
    Accelerator(
        "GB200", 186.0, {"bf16": 2500.0, "fp16": 2500.0, "fp8": 5000.0, "fp4": 10000.0, "tf32": 1250.0},
        "NVIDIA GB200 NVL72 datasheet (180 PFLOPS FP16/BF16 dense per 72 GPUs)",
        patterns=(r"gb200",),
    ),
    Accelerator(
        "B300", 288.0, {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp4": 13500.0, "tf32": 1100.0},
        "NVIDIA HGX B300 datasheet (per-GPU dense figures)",
        patterns=(r"\bb300",),
    ),
    Accelerator(
        "B200", 180.0, {"bf16": 2250.0, "fp16": 2250.0, "fp8": 4500.0, "fp4": 9000.0, "tf32": 1100.0},
        "NVIDIA HGX B200 / DGX B200 datasheet (2.25 PFLOPS BF16 dense per GPU)",
        patterns=(r"\bb200",),
    ),
    Accelerator(
        "GH200-144GB", 144.0, {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (144 GB HBM3e; dense = half the sparse figure)",
        patterns=(r"gh200.*(144|141)\s*g",),
    ),
    Accelerator(
        "GH200", 96.0, {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        "NVIDIA GH200 Grace Hopper Superchip datasheet (Hopper GPU, dense = half the sparse figure; both "
        "variants have the same peaks). memory_gib: the 96 GB HBM3 part (nvidia-smi: \"GH200 480GB\", the "
        "superchip's CPU+GPU memory); a GH200 named without its size gets the smaller of the two, so the "
        "memory model never calls fitting what might not",
        patterns=(r"gh200",),
    ),
    Accelerator(
        "H200-SXM-141GB", 141.0, {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        "NVIDIA H200 Tensor Core GPU datasheet (SXM, dense = half the sparse figure)",
        patterns=(r"h200",),
    ),
    Accelerator(
        "H100-PCIe-80GB", 80.0, {"bf16": 756.0, "fp16": 756.0, "fp8": 1513.0, "tf32": 378.0, "fp32": 51.0},
        "NVIDIA H100 Tensor Core GPU datasheet (PCIe, dense)",
        patterns=(r"h100.*pcie",),
    ),
    Accelerator(
        "H100-NVL-94GB", 94.0, {"bf16": 835.0, "fp16": 835.0, "fp8": 1670.0, "tf32": 418.0, "fp32": 60.0},
        "NVIDIA H100 NVL datasheet (per GPU, dense)",
        patterns=(r"h100.*nvl",),
    ),
    Accelerator(
        "H100-SXM-96GB-HBM2e", 96.0, {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        "H100 SXM with 96 GB HBM2e (Meta Grand Teton); same SM count and clocks as the H100 SXM "
        "datasheet, so its dense peaks are used (torchtitan benchmarks/llama3_h100_202412 used 989)",
        patterns=(r"h100.*(96|94|95)\s*(/\s*9\d)?\s*gb", r"h100.*hbm2e"),
    ),
    Accelerator(
        "H100-SXM-80GB", 80.0, {"bf16": 989.0, "fp16": 989.0, "fp8": 1979.0, "tf32": 494.0, "fp32": 67.0},
        "NVIDIA H100 Tensor Core GPU datasheet (SXM5: 989 TFLOPS BF16 dense, 1,979 FP8 dense)",
        patterns=(r"h100",),
    ),
    Accelerator(
        "A100-SXM-40GB", 40.0, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        "NVIDIA A100 Tensor Core GPU datasheet (312 TFLOPS BF16 dense)",
        patterns=(r"a100.*40\s*gb", r"a100_40"),
    ),
    Accelerator(
        "A100-SXM-80GB", 80.0, {"bf16": 312.0, "fp16": 312.0, "tf32": 156.0, "fp32": 19.5},
        "NVIDIA A100 Tensor Core GPU datasheet (312 TFLOPS BF16 dense)",
        patterns=(r"a100",),
    ),
    Accelerator(
        "V100-SXM2-32GB", 32.0, {"fp16": 125.0, "fp32": 15.7},
        "NVIDIA Tesla V100 datasheet (SXM2: 125 TFLOPS tensor FP16, 15.7 FP32; no BF16, so a bf16 run "
        "on it has no MFU). Matched only when the name says SXM2 and the size (nvidia-smi: Tesla V100-SXM2-32GB)",
        patterns=(r"v100.*sxm.*32",),
    ),
    Accelerator(
        "V100-SXM2-16GB", 16.0, {"fp16": 125.0, "fp32": 15.7},
        "NVIDIA Tesla V100 datasheet (SXM2: 125 TFLOPS tensor FP16, 15.7 FP32; no BF16)",
        patterns=(r"v100.*sxm.*16",),
    ),
    Accelerator(
        "V100-PCIe-32GB", 32.0, {"fp16": 112.0, "fp32": 14.0},
        "NVIDIA Tesla V100 datasheet (PCIe: 112 TFLOPS tensor FP16, 14 FP32; no BF16)",
        patterns=(r"v100.*pcie.*32",),
    ),
    Accelerator(
        "V100-PCIe-16GB", 16.0, {"fp16": 112.0, "fp32": 14.0},
        "NVIDIA Tesla V100 datasheet (PCIe: 112 TFLOPS tensor FP16, 14 FP32; no BF16)",
        patterns=(r"v100.*pcie.*16",),
    ),
    Accelerator(
        "L40S", 48.0, {"bf16": 362.0, "fp16": 362.0, "fp8": 733.0, "tf32": 183.0, "fp32": 91.6},
        "NVIDIA L40S datasheet (dense)",
        patterns=(r"l40s",),
    ),
    Accelerator(
        "MI300X", 192.0, {"bf16": 1307.0, "fp16": 1307.0, "fp8": 2615.0, "tf32": 654.0, "fp32": 163.4},
        "AMD Instinct MI300X datasheet (dense)", vendor="AMD",
        patterns=(r"mi300x",),
    ),
    Accelerator(
        "MI250X", 128.0, {"bf16": 383.0, "fp16": 383.0, "fp32": 95.7},
        "AMD Instinct MI250X datasheet", vendor="AMD",
        patterns=(r"mi250x",),
    ),
    Accelerator(
        "TPU-v5p", 95.0, {"bf16": 459.0, "fp8": 918.0},
        "Google Cloud TPU v5p documentation (459 TFLOPS BF16, 95 GB HBM per chip)", vendor="Google",
        patterns=(r"tpu\s*-?\s*v5p",),
    ),
    Accelerator(
        "TPU-v5e", 16.0, {"bf16": 197.0, "fp8": 394.0},
        "Google Cloud TPU v5e documentation (197 TFLOPS BF16, 16 GB HBM per chip)", vendor="Google",
        patterns=(r"tpu\s*-?\s*v5e", r"v5litepod"),
    ),
)

#: per accelerator: (intra-node GB/s per GPU per direction, inter-node GB/s per GPU per direction,
#: source). Intra-node is half the vendor's bidirectional NVLink / Infinity Fabric / ICI figure;
#: inter-node is the reference system's NIC per GPU (DGX/HGX: one NIC per GPU) in bytes.
LINKS: dict[str, tuple[float, float, str]] = {
    "GB300": (900.0, 100.0, "NVLink 5 1.8 TB/s bidirectional; ConnectX-8 800 Gb/s per GPU (GB300 NVL72 datasheet)"),
    "GB200": (900.0, 50.0, "NVLink 5 1.8 TB/s bidirectional; ConnectX-7 400 Gb/s per GPU (GB200 NVL72 datasheet)"),
    "B300": (900.0, 100.0, "NVLink 5 1.8 TB/s bidirectional; ConnectX-8 800 Gb/s per GPU (HGX B300 datasheet)"),
    "B200": (900.0, 50.0, "NVLink 5 1.8 TB/s bidirectional; 8x ConnectX-7 400 Gb/s (DGX B200 datasheet)"),
    "GH200-144GB": (450.0, 50.0, "NVLink 4 900 GB/s bidirectional GPU-to-GPU (GH200 datasheet); ConnectX-7 "
                    "400 Gb/s per superchip (GH200 reference systems)"),
    "GH200": (450.0, 50.0, "NVLink 4 900 GB/s bidirectional GPU-to-GPU (GH200 datasheet); ConnectX-7 400 Gb/s "
              "per superchip (GH200 reference systems)"),
    "H200-SXM-141GB": (450.0, 50.0, "NVLink 4 900 GB/s bidirectional; 400 Gb/s NIC per GPU (H200 datasheet, HGX H200)"),
    "H100-PCIe-80GB": (64.0, 25.0, "PCIe Gen5 x16 128 GB/s bidirectional (H100 PCIe datasheet); 200 Gb/s NIC assumed"),
    "H100-NVL-94GB": (300.0, 50.0,
                      "NVLink bridge 600 GB/s bidirectional between pairs (H100 NVL datasheet); 400 Gb/s NIC"),
    "H100-SXM-96GB-HBM2e": (450.0, 50.0, "as H100 SXM: NVLink 4 900 GB/s bidirectional; 400 Gb/s NIC per GPU"),
    "H100-SXM-80GB": (450.0, 50.0, "NVLink 4 900 GB/s bidirectional (H100 datasheet); 8x ConnectX-7 400 Gb/s "
                      "per DGX H100 (DGX H100 user guide)"),
    "A100-SXM-40GB": (300.0, 25.0, "NVLink 3 600 GB/s bidirectional (A100 datasheet); 8x ConnectX-6 200 Gb/s "
                      "per DGX A100 (DGX A100 user guide)"),
    "A100-SXM-80GB": (300.0, 25.0, "NVLink 3 600 GB/s bidirectional (A100 datasheet); 8x ConnectX-6 200 Gb/s "
                      "per DGX A100 (DGX A100 user guide)"),
    "V100-SXM2-32GB": (150.0, 6.25, "NVLink 2 300 GB/s bidirectional (V100 datasheet); 4x EDR 100 Gb/s per "
                       "8 GPUs in a DGX-1 (DGX-1 user guide)"),
    "V100-SXM2-16GB": (150.0, 6.25, "NVLink 2 300 GB/s bidirectional (V100 datasheet); 4x EDR 100 Gb/s per "
                       "8 GPUs in a DGX-1 (DGX-1 user guide)"),
    "V100-PCIe-32GB": (16.0, 6.25, "no NVLink: PCIe Gen3 x16 32 GB/s bidirectional (V100 datasheet); 100 Gb/s "
                       "NIC per 2 GPUs assumed"),
    "V100-PCIe-16GB": (16.0, 6.25, "no NVLink: PCIe Gen3 x16 32 GB/s bidirectional (V100 datasheet); 100 Gb/s "
                       "NIC per 2 GPUs assumed"),
    "L40S": (32.0, 25.0, "no NVLink: PCIe Gen4 x16 64 GB/s bidirectional (L40S datasheet); 200 Gb/s NIC assumed"),
    "MI300X": (448.0, 50.0, "Infinity Fabric 7 links, 896 GB/s bidirectional (MI300X datasheet); 400 Gb/s NIC per GPU"),
    "MI250X": (200.0, 25.0, "Infinity Fabric 400 GB/s bidirectional peer (MI250X datasheet); 200 Gb/s NIC"),
    "TPU-v5p": (300.0, 25.0, "ICI 4,800 Gb/s per chip (Cloud TPU v5p documentation); DCN 200 Gb/s assumed"),
    "TPU-v5e": (100.0, 25.0, "ICI 1,600 Gb/s per chip (Cloud TPU v5e documentation); DCN 200 Gb/s assumed"),
}

_BY_NAME = {a.name.lower(): a for a in CATALOG}

# precision strings as frameworks write them -> catalog key (exact matches, after "torch." is dropped)
_PRECISION_KEYS = {
    "bf16": "bf16", "bfloat16": "bf16", "amp_bf16": "bf16", "bf16-mixed": "bf16",
    "fp16": "fp16", "float16": "fp16", "half": "fp16", "amp_fp16": "fp16", "16-mixed": "fp16",
    "fp8": "fp8", "mxfp8": "fp8", "amp_fp8": "fp8", "fp8-hybrid": "fp8", "nvfp8": "fp8",
    "fp4": "fp4", "nvfp4": "fp4", "mxfp4": "fp4",
    "tf32": "tf32", "fp32": "fp32", "float32": "fp32", "float": "fp32", "32-true": "fp32",
    "fp64": "fp64", "float64": "fp64", "double": "fp64",
}
# otherwise the first of these found in the string names it: recipe suffixes ("FP8-CS", "fp8-delayed",
# "MXFP8-blockwise", "NVFP4-…"), descriptions ("None (bfloat16)", "Float8 tensorwise")
_PRECISION_WORDS = (("fp4", "fp4"), ("float4", "fp4"), ("fp8", "fp8"), ("float8", "fp8"),
                    ("bf16", "bf16"), ("bfloat16", "bf16"), ("fp16", "fp16"), ("float16", "fp16"),
                    ("tf32", "tf32"), ("fp32", "fp32"), ("float32", "fp32"))


def canonical_precision(precision: str | None) -> str | None:
    """The one precision normaliser (the server's write path and queries, the log and CSV parsers,
    the models): a precision as frameworks write it -> bf16/fp16/fp8/fp4/tf32/fp32/fp64.

    "torch.bfloat16", "amp_bf16", "bf16-mixed", "None (bfloat16)" -> "bf16"; "half", "float16",
    "16-mixed" -> "fp16"; "FP8", "MXFP8", "FP8-CS", "Float8 tensorwise" -> "fp8"; "NVFP4" -> "fp4";
    "float", "float32" -> "fp32". Another string is returned stripped and lower-cased (the server then
    derives no MFU for it and says why); None and blank give None.
    """
    if precision is None:
        return None
    p = precision.strip().lower()
    if not p:
        return None
    p = p.removeprefix("torch.")
    if p in _PRECISION_KEYS:
        return _PRECISION_KEYS[p]
    for word, key in _PRECISION_WORDS:
        if word in p:
            return key
    return p


@functools.lru_cache(maxsize=4096)
def lookup(gpu_type: str | None) -> Accelerator | None:
    """The catalog entry for a canonical name or any alias ("h100_80gb", "DGX-H100"); None if unknown.
    Cached per name: the catalog is fixed, and every ingested run looks its GPU up (the alias
    patterns are regular expressions tried in turn)."""
    if not gpu_type:
        return None
    key = gpu_type.strip().lower()
    if key in _BY_NAME:
        return _BY_NAME[key]
    for acc in CATALOG:
        if any(re.search(p, key) for p in acc.patterns):
            return acc
    return None


def canonical_gpu_type(gpu_type: str | None) -> str | None:
    """Canonical catalog name for a reported accelerator name, or None when the catalog has no match."""
    acc = lookup(gpu_type)
    return acc.name if acc else None


#: HBM bandwidth per accelerator, TB/s (10^12 bytes/s), with its source: the speed of the memory-bound
#: work of a training step (elementwise kernels, unfused attention softmax, the optimizer update) in
#: the throughput model (service/analytics/throughput_terms.py)
HBM: dict[str, tuple[float, str]] = {
    "GB300": (8.0, "GB300 NVL72 datasheet: 576 TB/s HBM3e per 72 GPUs"),
    "GB200": (8.0, "GB200 NVL72 datasheet: 576 TB/s HBM3e per 72 GPUs"),
    "B300": (8.0, "HGX B300 datasheet: 8 TB/s HBM3e per GPU"),
    "B200": (8.0, "HGX B200 / DGX B200 datasheet: 8 TB/s HBM3e per GPU"),
    "GH200-144GB": (4.9, "GH200 datasheet: 144 GB HBM3e, 4.9 TB/s"),
    "GH200": (4.0, "GH200 datasheet: 96 GB HBM3, 4 TB/s"),
    "H200-SXM-141GB": (4.8, "H200 datasheet: 141 GB HBM3e, 4.8 TB/s"),
    "H100-PCIe-80GB": (2.0, "H100 PCIe datasheet: 80 GB HBM2e, 2 TB/s"),
    "H100-NVL-94GB": (3.9, "H100 NVL datasheet: 94 GB HBM3, 3.9 TB/s"),
    "H100-SXM-96GB-HBM2e": (2.4, "not published: the H100 PCIe's HBM2e figure (2 TB/s for 5 stacks, 80 GB) scaled "
                            "to 6 stacks (96 GB), 2.4 TB/s"),
    "H100-SXM-80GB": (3.35, "H100 datasheet: SXM 80 GB HBM3, 3.35 TB/s"),
    "A100-SXM-40GB": (1.555, "A100 datasheet: 40 GB HBM2, 1,555 GB/s"),
    "A100-SXM-80GB": (2.039, "A100 datasheet: SXM 80 GB HBM2e, 2,039 GB/s"),
    "V100-SXM2-32GB": (0.9, "V100 datasheet: 900 GB/s HBM2"),
    "V100-SXM2-16GB": (0.9, "V100 datasheet: 900 GB/s HBM2"),
    "V100-PCIe-32GB": (0.9, "V100 datasheet: 900 GB/s HBM2"),
    "V100-PCIe-16GB": (0.9, "V100 datasheet: 900 GB/s HBM2"),
    "L40S": (0.864, "L40S datasheet: 48 GB GDDR6, 864 GB/s"),
    "MI300X": (5.3, "MI300X datasheet: 192 GB HBM3, 5.3 TB/s"),
    "MI250X": (3.2768, "MI250X datasheet: 128 GB HBM2e, 3.2768 TB/s"),
    "TPU-v5p": (2.765, "Cloud TPU v5p documentation: 95 GiB HBM2e, 2,765 GB/s per chip"),
    "TPU-v5e": (0.819, "Cloud TPU v5e documentation: 16 GiB HBM2, 819 GB/s per chip"),
}


def hbm_bytes_per_s(gpu_type: str | None) -> float:
    """HBM bandwidth of an accelerator in bytes/s (HBM). Raises ValueError naming gpu_type when the
    catalog does not know it."""
    acc = lookup(gpu_type)
    if acc is None or acc.name not in HBM:
        raise ValueError(f"gpu_type: {gpu_type!r} has no HBM bandwidth in the hardware catalog")
    return HBM[acc.name][0] * 1e12


def peak_tflops(gpu_type: str | None, precision: str | None) -> float | None:
    """Dense peak TFLOP/s of one accelerator at a precision (bf16, fp16, fp8, fp4, tf32, fp32, or
    the strings frameworks write for them: canonical_precision).

    Returns None for unknown hardware, for no precision, and for a precision the catalog lists no
    figure for on that accelerator (fp8 on A100, bf16 on V100, an unknown string): an MFU against
    another precision's peak would be a guess.
    """
    acc = lookup(gpu_type)
    key = canonical_precision(precision)
    if acc is None or key is None:
        return None
    return acc.peak_tflops.get(key)
