"""Derive GPU compute profiles of well-known models from published facts.

Writes ``datasets/profiles/derived/<model>__<device>.json`` (format
``thrifty.compute_profile/1``, see ``perfmodels/profile.py``) for every model in
`MODELS` on every device in `DEVICES`, and ``datasets/profiles/derived/README.md``.
Nothing is downloaded: every published number this script uses is written
below with its source (`SOURCES`), and each profile lists the ones it used in
``provenance.inputs``.

    python datasets/scripts/derive_profiles.py [--out DIR]

Method (FP32 training, PyTorch data-parallel, as in Srifty; on Ampere and newer
GPUs "FP32" means TF32 tensor-core math for convolutions and matmuls, which is
what the published throughputs on those GPUs measured: NGC containers and
TensorFlow allow TF32 for both, stock PyTorch >= 1.12 for convolutions only):

1. Architectures are enumerated analytically (`build_model`): every layer with
   its parameter tensors, forward multiply-adds (MACs) per sample, memory
   traffic per sample and per batch. Parameter totals are asserted within 1% of
   the published counts (`PUBLISHED_PARAMS`), MACs within 3% of published
   figures where they exist.
2. Per-layer roofline: a layer's GPU time at batch B is
   ``max(B * 2 * MACs / (eta_c * peak), (B * bytes + weight_bytes) / (eta_m * bw)) / k``
   forward, and twice the work backward (input and weight gradients). In FP32
   math (GPUs before Ampere) a dense 3x3 stride-1 convolution counts the
   MACs of Winograd's F(2x2,3x3), 16/36 of the direct ones (cuDNN's choice
   there); TF32 tensor cores run the direct MACs. ``peak``
   and ``bw`` are the GPU's published peak FP32 (TF32 tensor on Ampere+) FLOP/s
   and memory bandwidth; ``eta_m`` is a fixed achievable fraction of the
   bandwidth; ``eta_c`` (achieved fraction of peak) is calibrated per GPU and
   software stack so that ResNet-50 reproduces its published training
   throughput on that GPU; ``k`` is a per-model speed factor calibrated so
   that the model reproduces its own published throughput(s).
   A model with no published throughput on a GPU keeps the ``k`` of its
   anchors elsewhere (geometric mean), i.e. its throughput is scaled from a
   published anchor by the ratio of achieved FLOP/s (and bytes/s) that the
   calibrated roofline predicts for the two GPUs.
3. Latency-bound region: a pass cannot finish before the host has launched its
   kernels, ``K_HOST`` each: ``L_f = n_ops * K_HOST`` forward and
   ``L_b = n_bwd_kernels * K_HOST`` backward, where ``n_bwd_kernels`` counts the
   kernels the autograd engine launches (`Op.bwd_launches`: weight, input and
   bias gradients of a conv or linear, one per batch norm, pooling or
   elementwise op, ...; about 1.3x the forward's ops for ResNets, 1.7x for
   AlexNet), not twice the forward (the 1:2 split is one of FLOPs, not of
   launches). ``K_HOST`` is calibrated on the published batch-1 inference
   latency of ResNet-50 (which is flat from batch 1 to 4: host-bound). A pass
   takes ``max(L, sum of layer GPU times)``: flat at small batches, then
   piecewise-linear in B (Srifty 4.1, Figure 5).
4. ``step_s``: the optimizer step (SGD with momentum for CNNs, AdamW for
   transformers, plain SGD for DLRM) as PyTorch 2 runs it on CUDA by default:
   a foreach step, a few kernels over all parameter tensors at once, so
   memory-bound over the parameters (`OPT_BYTES_PER_PARAM`, pass by pass),
   plus a host cost per parameter tensor (the step's and zero_grad's Python
   loops) calibrated on the one measured step, ResNet-50's on an H100
   (`STEP_MEASURED_S`), not one kernel launch per tensor.
5. ``max_batch`` per GPU: Srifty Table 3 (per instance, divided by the GPUs of
   the instance) on V100, M60 and T4; elsewhere a memory model (static bytes
   for weights, gradients, optimizer state and DDP buckets plus activations per
   sample) whose per-sample activation size is calibrated to be consistent with
   every Table 3 entry of that model, rounded down to a power of two as in
   Table 3.
6. Standard deviations: coefficient of variation `CV` (Srifty 2.2).
7. ``ready_frac``: cumulative backward GPU time from the output side up to and
   including the layer, over the total; layers listed in backward order.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

SCRIPT = "datasets/scripts/derive_profiles.py"
DERIVED_DATE = "2026-11-26"
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "profiles" / "derived"

MODELS = [
    "resnet18", "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "bert-base", "alexnet",
    "inception-v3", "shufflenet-v2-x2.0", "resnext50", "squeezenet1.1", "xlm", "dlrm",
]
DEVICES_OUT = ["V100", "M60", "T4", "A10G", "L4", "A100", "H100"]

GIB = 1024 ** 3
ETA_M = 0.8  # achievable fraction of peak DRAM bandwidth (assumption, typical of STREAM-like kernels)
CV = 0.025  # coefficient of variation of forward/backward latency (see SOURCES["srifty-var"])
# cuDNN runs dense 3x3 stride-1 convolutions (forward, data and filter gradients) with Winograd's minimal
# filtering in FP32 math: F(2x2,3x3) does 16 multiplications where the direct convolution does 36
# (SOURCES["winograd"]). TF32 tensor cores run implicit GEMM: the direct MACs. Without this, eta_c came out
# above 1 on V100 and a 3x3-heavy model's factor k carried the FP32 GPU's Winograd saving to TF32 GPUs.
WINOGRAD_MAC_REDUCTION = 36 / 16
MEM_RESERVE_GIB = 0.75  # CUDA context, cuDNN/cuBLAS workspaces, allocator slack (assumption)

# ---------------------------------------------------------------------------
# Sources (key -> citation). Profiles cite the keys they use, expanded.
# ---------------------------------------------------------------------------
SOURCES: dict[str, str] = {
    "srifty-t3": "Srifty (Luo et al., MLSys 2022) Table 3, max batch per instance: p3.8xlarge (4x V100), "
                 "g3.8xlarge (2x M60), g4dn.8xlarge (1x T4); divided by GPUs per instance",
    "srifty-case1": "Srifty 5.2 Case 1: ResNet50, config 1g4dn@128 (CGF) = 1.1 s/iter on one g4dn.8xlarge "
                    "(1x T4), PyTorch 1.5, CUDA 10.1, synthetic ImageNet -> 116 img/s",
    "srifty-case3": "Srifty 5.2 Case 3: AlexNet, config 1g3@1024 (CGF) = 0.535 s/iter on one g3.8xlarge "
                    "(2x M60, 512 per GPU; the intra-instance allreduce is counted as compute) -> 957 img/s per M60",
    "srifty-case4": "Srifty 5.2 Case 4: DLRM, config 1g4dn@1024 = 0.0024 cents/iter at the Table 3 g4dn rate "
                    "$0.72/h -> 0.12 s/iter on one T4",
    "srifty-var": "Srifty 2.2 / Figure 2: compute latency across 760 g4dn VMs and 2500 iterations is near-normal "
                  "with max/min up to 1.1x, i.e. sd about 1.5-2% of the mean; CV 2.5% used",
    "srifty-fig5": "Srifty 3, takeaway 4 / Figure 5: training is latency-bound at small batches and becomes "
                   "throughput-bound as the batch grows (ResNet18 on T4); the figure's values are not in the text",
    "dle-rn50": "NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets/resnet50v1.5/README.md "
                "(pytorch-21.03 NGC container): 1-GPU training V100 16GB FP32 367 img/s, V100 32GB FP32 356 img/s, "
                "A100 80GB TF32 938 img/s; FP32 inference latency at batch 1: V100 10.37 ms, T4 10.7 ms; "
                "FP32 inference throughput T4 428 img/s (batch 64), V100 1261 img/s (batch 256)",
    "dle-rnx101": "NVIDIA DeepLearningExamples PyTorch/Classification/ConvNets/resnext101-32x4d/README.md "
                  "(pytorch-20.06): 1-GPU training V100 16GB FP32 150.05 img/s (batch 64), A100 TF32 "
                  "300.42 img/s (batch 128); FP32 inference latency at batch 1: V100 21.02 ms, T4 17.88 ms",
    "dle-bert-tf": "NVIDIA DeepLearningExamples TensorFlow/LanguageModeling/BERT/README.md (TensorFlow 20.06 "
                   "NGC): BERT-Base SQuAD FP32 inference, seq 384, batch 8: 1x V100 32GB 146.28 sentences/s, "
                   "1x T4 31.8 sentences/s (seq 128, batch 8: 449.12 and 98.92)",
    "dle-dlrm": "NVIDIA DeepLearningExamples PyTorch/Recommendation/DLRM/README.md (April 2020): 1x V100 32GB, "
                "batch 32k, FP32 494k samples/s (bottom MLP 512-256-128, top 1024-1024-512-256-1, embedding dim 128)",
    "lambda-pt": "Lambda deeplearning-benchmark, pytorch/pytorch-train-throughput-fp32.csv and "
                 "pytorch-train-bs-fp32.csv (NGC PyTorch 22.10; 'fp32' runs TF32 on Ampere/Hopper): resnet50 "
                 "img/s and bert_base_squad seq/s (seq 384): V100 16GB 369 (bs 128) / 42 (bs 24); A10 349 / 70; "
                 "A100 40GB PCIe 882 (bs 360) / 179 (bs 80); A100 80GB SXM4 1066 (bs 640) / 239 (bs 172); "
                 "H100 80GB SXM5 1753 / 408 (batch sizes of the A10 and H100 rows not listed: those of the "
                 "same-memory rows, RTX 3090 224 / 48 and H100 PCIe 640 / 172)",
    "lambda-tf": "Lambda lambda-tensorflow-benchmark tf-train-throughput-fp32.csv and tf-train-bs-fp32.csv "
                 "(tf_cnn_benchmarks, synthetic data), img/s (batch): V100 32GB: alexnet 5132 (1536), inception3 "
                 "273 (192), resnet152 167 (96), resnet50 432 (192), vgg16 249 (192); A100 40GB PCIe: alexnet "
                 "10187 (1792), inception3 627 (224), resnet152 390 (112), resnet50 953 (224), vgg16 504 (224)",
    "cnnbench-m60": "Paperspace/cnn-benchmarks README 'GPU in the Cloud' (fork of jcjohnson/cnn-benchmarks; "
                    "copy read from dmikushin/cnn-benchmarks): Tesla M60 (Azure NV), Torch7, cuDNN 5.1.10, batch 16, "
                    "forward/backward ms: ResNet-18 25.89/52.77, ResNet-50 91.89/173.12, ResNet-101 142.62/257.42, "
                    "ResNet-152 200.83/359.60, VGG-16 107.41/233.42, VGG-19 125.61/277.30",
    "thrifty-h100": "thrifty's own measurement (benchmarks/gpu_check.sh, 2026-11-26; "
                    "datasets/profiles/measured/resnet50__H100.json): ResNet-50 SGD-momentum (foreach) "
                    "optimizer.step() + zero_grad() 0.881 ms on one NVIDIA H100 80GB HBM3, torch 2.11.0+cu130",
    "winograd": "Lavin and Gray, 'Fast Algorithms for Convolutional Neural Networks' (CVPR 2016): Winograd's "
                "minimal filtering F(2x2,3x3) computes a 2x2 output tile of a 3x3 convolution with 16 "
                "multiplications instead of 36 (2.25x fewer); NVIDIA cuDNN (5 and later) offers Winograd algorithms "
                "for 3x3 stride-1 convolutions forward and for both gradients (CUDNN_CONVOLUTION_*_ALGO_WINOGRAD*)",
    "tf32-defaults": "PyTorch CUDA semantics notes (TensorFloat-32 on Ampere and later) and MONAI 'Precision and "
                     "Accelerating': torch.backends.cuda.matmul.allow_tf32 defaults to False since PyTorch 1.12, "
                     "torch.backends.cudnn.allow_tf32 to True; NGC PyTorch containers set "
                     "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1, which turns TF32 matmuls on",
    "spec-v100": "NVIDIA Tesla V100 datasheet (SXM2, p3): 15.7 TFLOPS FP32, 900 GB/s HBM2, 16 GB",
    "spec-m60": "NVIDIA Tesla M60 datasheet: 2 GPUs per board, 9.64 TFLOPS FP32 per board (4.82 per GPU), "
                "8 GB GDDR5 and 160 GB/s per GPU",
    "spec-t4": "NVIDIA T4 datasheet: 8.1 TFLOPS FP32 (no TF32), 320 GB/s GDDR6, 16 GB",
    "spec-a10": "NVIDIA A10 datasheet: 31.2 TFLOPS FP32, 62.5 TFLOPS TF32 tensor (dense), 600 GB/s, 24 GB",
    "spec-a10g": "Baseten, 'NVIDIA A10 vs A10G for ML model inference': AWS's A10G shares the A10's 24 GB and "
                 "600 GB/s but trades tensor throughput for CUDA-core throughput (35 TFLOPS FP32, 35 TFLOPS TF32 "
                 "tensor); used with the A10's achieved efficiency",
    "spec-l4": "NVIDIA L4 datasheet: 30.3 TFLOPS FP32, 120 TFLOPS TF32 tensor with sparsity (60 dense), "
               "300 GB/s GDDR6, 24 GB",
    "spec-a100": "NVIDIA A100 datasheet: 19.5 TFLOPS FP32, 156 TFLOPS TF32 tensor (dense); SXM4 40GB (p4d) "
                 "1555 GB/s, 80GB 2039 GB/s",
    "spec-h100": "NVIDIA H100 datasheet (SXM5 80GB, p5): 67 TFLOPS FP32, 989 TFLOPS TF32 tensor with sparsity "
                 "(494.7 dense), 3.35 TB/s HBM3",
    "gpu-memory": "memory visible to CUDA (nvidia-smi totals as commonly reported): V100-SXM2-16GB 16160 MiB, "
                  "Tesla M60 8129 MiB, T4 15109 MiB (ECC on), A10G/L4 22.35 GiB (AWS DescribeInstanceTypes), "
                  "A100-SXM4-40GB 40536 MiB, H100-SXM5-80GB 81559 MiB",
    "torchvision": "torchvision model documentation (pytorch.org/vision/stable/models.html): parameter counts "
                   "and GFLOPS (multiply-adds) per classification model",
    "bert-params": "keras-team/keras-hub bert_presets.py: bert_base_en (12-layer cased BERT-Base, encoder and "
                   "pooler) 108,310,272 parameters; BERT paper (Devlin et al. 2019): BERT-Base 110M",
    "xlm-config": "FacebookAI/xlm-clm-ende-1024 config.json (Hugging Face Hub): emb_dim 1024, n_layers 6, "
                  "n_heads 8, n_langs 2, n_words 64699, share_inout_emb true; XLMConfig default "
                  "max_position_embeddings 512. No total is published: the reference is the closed form of this config",
    "dlrm-config": "facebookresearch/dlrm Criteo Terabyte configuration (mlcommons reference dlrm_s_pytorch.py): "
                   "--arch-sparse-feature-size=64 --arch-mlp-bot=13-512-256-64 --arch-mlp-top=512-512-256-1, "
                   "26 tables with the Criteo Terabyte cardinalities of the MLPerf DLRM reference (39884406, 39043, "
                   "...); tables hashed to --max-ind-range=1000000 (our choice, see README). No total is published: "
                   "the reference is the closed form of this config",
}

# ---------------------------------------------------------------------------
# Devices: published peak (FP32, or TF32 tensor on Ampere+), bandwidth, memory.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    name: str
    peak_tflops: float  # what convolutions/matmuls run on in FP32 training (TF32 tensor on Ampere+)
    math: str
    bw_gbs: float
    mem_gib: float  # visible to CUDA
    spec: str  # SOURCES key


DEVICES: dict[str, Device] = {
    "V100": Device("V100", 15.7, "FP32", 900, 16160 / 1024, "spec-v100"),
    "M60": Device("M60", 4.82, "FP32", 160, 8129 / 1024, "spec-m60"),
    "T4": Device("T4", 8.1, "FP32", 320, 15109 / 1024, "spec-t4"),
    "A10G": Device("A10G", 35.0, "TF32", 600, 22.35, "spec-a10g"),
    "L4": Device("L4", 60.0, "TF32", 300, 22.35, "spec-l4"),
    "A100": Device("A100", 156.0, "TF32", 1555, 40536 / 1024, "spec-a100"),
    "H100": Device("H100", 494.7, "TF32", 3350, 81559 / 1024, "spec-h100"),
    # GPUs that only appear in published anchors
    "V100-32GB": Device("V100-32GB", 15.7, "FP32", 900, 32.0, "spec-v100"),
    "A10": Device("A10", 62.5, "TF32", 600, 22.0, "spec-a10"),
    "A100-PCIe-40GB": Device("A100-PCIe-40GB", 156.0, "TF32", 1555, 40.0, "spec-a100"),
    "A100-80GB": Device("A100-80GB", 156.0, "TF32", 2039, 80.0, "spec-a100"),
}

# ---------------------------------------------------------------------------
# Calibration contexts: a GPU with one software stack, and ResNet-50's
# published training throughput there (it fixes eta_c for that context).
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Context:
    name: str
    device: str
    rn50_img_s: float
    rn50_batch: int
    include_step: bool  # the published figure covers a whole iteration (with the optimizer step)
    source: str
    software: str
    rn50_fwd_bwd_s: tuple[float, float] | None = None  # separate forward/backward at rn50_batch


CONTEXTS: dict[str, Context] = {c.name: c for c in [
    Context("lambda-pt-V100", "V100", 369, 128, True, "lambda-pt", "NGC PyTorch 22.10"),
    Context("lambda-pt-A10", "A10", 349, 224, True, "lambda-pt", "NGC PyTorch 22.10"),
    Context("lambda-pt-A100", "A100-80GB", 1066, 640, True, "lambda-pt", "NGC PyTorch 22.10, TF32"),
    Context("lambda-pt-H100", "H100", 1753, 640, True, "lambda-pt", "NGC PyTorch 22.10, TF32"),
    Context("srifty-T4", "T4", 128 / 1.1, 128, True, "srifty-case1", "PyTorch 1.5, CUDA 10.1"),
    Context("cnnbench-M60", "M60", 16 / (0.09189 + 0.17312), 16, False, "cnnbench-m60", "Torch7, cuDNN 5.1",
            (0.09189, 0.17312)),
    Context("lambda-tf-V100", "V100-32GB", 432, 192, True, "lambda-tf", "TensorFlow tf_cnn_benchmarks"),
    Context("lambda-tf-A100", "A100-PCIe-40GB", 953, 224, True, "lambda-tf", "TensorFlow tf_cnn_benchmarks, TF32"),
    Context("dle-V100", "V100", 367, 128, True, "dle-rn50", "NGC PyTorch 21.03"),
    Context("dle-V100-32GB", "V100-32GB", 356, 128, True, "dle-rn50", "NGC PyTorch 21.03"),
    Context("dle-A100", "A100-80GB", 938, 256, True, "dle-rn50", "NGC PyTorch 21.03, TF32"),
]}

# Which context gives each output device its eta_c.
DEVICE_CONTEXT = {"V100": "lambda-pt-V100", "M60": "cnnbench-M60", "T4": "srifty-T4", "A10G": "lambda-pt-A10",
                  "L4": "lambda-pt-A10", "A100": "lambda-pt-A100", "H100": "lambda-pt-H100"}
# GPU family of each anchor device, and for each output device the families whose per-model factors it
# borrows when the model has no published throughput on that device, most similar first (same math:
# FP32 CUDA cores vs TF32 tensor cores, then the nearest generation).
HARDWARE = {"V100": "V100", "V100-32GB": "V100", "M60": "M60", "T4": "T4", "A10": "A10",
            "A100-80GB": "A100", "A100-PCIe-40GB": "A100", "H100": "H100"}
PREFERENCE = {
    "V100": ["V100", "T4", "A100", "A10", "H100", "M60"],
    "T4": ["T4", "V100", "A10", "A100", "H100", "M60"],
    "M60": ["M60", "V100", "T4", "A100", "A10", "H100"],
    "A10G": ["A10", "A100", "H100", "V100", "T4", "M60"],
    "L4": ["A10", "A100", "H100", "T4", "V100", "M60"],
    "A100": ["A100", "A10", "H100", "V100", "T4", "M60"],
    "H100": ["H100", "A100", "A10", "V100", "T4", "M60"],
}
# A model anchored on fewer GPUs than a close relative keeps its ratio to that relative.
FAMILY_REF = {"resnet18": "resnet50", "resnet101": "resnet50", "resnet152": "resnet50", "vgg19": "vgg16"}


# ---------------------------------------------------------------------------
# Model anchors: published throughputs of a model (variant) in a context.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Anchor:
    model: str  # profile model this anchor calibrates
    variant: str  # architecture actually measured (may differ: seq length, head, family member)
    context: str
    samples_s: float
    batch: int
    include_step: bool
    source: str
    note: str = ""
    # A relative anchor: the published ratio samples_s / ref_samples_s between this context and
    # ref_context, measured with one software stack (e.g. inference only: forward_only).
    ref_context: str | None = None
    ref_samples_s: float | None = None
    forward_only: bool = False


ANCHORS: list[Anchor] = [
    # ResNet-50 anchors are the contexts themselves (k = 1 by construction).
    Anchor("resnet18", "resnet18", "cnnbench-M60", 16 / (0.02589 + 0.05277), 16, False, "cnnbench-m60"),
    Anchor("resnet101", "resnet101", "cnnbench-M60", 16 / (0.14262 + 0.25742), 16, False, "cnnbench-m60"),
    Anchor("resnet152", "resnet152", "cnnbench-M60", 16 / (0.20083 + 0.35960), 16, False, "cnnbench-m60"),
    Anchor("resnet152", "resnet152", "lambda-tf-V100", 167, 96, True, "lambda-tf"),
    Anchor("resnet152", "resnet152", "lambda-tf-A100", 390, 112, True, "lambda-tf"),
    Anchor("vgg16", "vgg16", "cnnbench-M60", 16 / (0.10741 + 0.23342), 16, False, "cnnbench-m60"),
    Anchor("vgg16", "vgg16", "lambda-tf-V100", 249, 192, True, "lambda-tf"),
    Anchor("vgg16", "vgg16", "lambda-tf-A100", 504, 224, True, "lambda-tf"),
    Anchor("vgg19", "vgg19", "cnnbench-M60", 16 / (0.12561 + 0.27730), 16, False, "cnnbench-m60"),
    Anchor("alexnet", "alexnet", "cnnbench-M60", 512 / 0.535, 512, True, "srifty-case3",
           "Srifty's own PyTorch run on g3.8xlarge; the Torch7 AlexNet of cnn-benchmarks is the grouped BVLC "
           "variant and is not used"),
    Anchor("alexnet", "alexnet", "lambda-tf-V100", 5132, 1536, True, "lambda-tf"),
    Anchor("alexnet", "alexnet", "lambda-tf-A100", 10187, 1792, True, "lambda-tf"),
    Anchor("inception-v3", "inception-v3", "lambda-tf-V100", 273, 192, True, "lambda-tf"),
    Anchor("inception-v3", "inception-v3", "lambda-tf-A100", 627, 224, True, "lambda-tf"),
    Anchor("resnext50", "resnext101-32x4d", "dle-V100", 150.05, 64, True, "dle-rnx101",
           "ResNeXt-101 32x4d: same block design as ResNeXt-50 32x4d"),
    Anchor("resnext50", "resnext101-32x4d", "dle-A100", 300.42, 128, True, "dle-rnx101",
           "ResNeXt-101 32x4d: same block design as ResNeXt-50 32x4d"),
    Anchor("bert-base", "bert-base-squad384", "lambda-pt-V100", 42, 24, True, "lambda-pt",
           "BERT-Base SQuAD fine-tuning, seq 384"),
    Anchor("bert-base", "bert-base-squad384", "lambda-pt-A10", 70, 48, True, "lambda-pt",
           "BERT-Base SQuAD fine-tuning, seq 384"),
    Anchor("bert-base", "bert-base-squad384", "lambda-pt-A100", 239, 172, True, "lambda-pt",
           "BERT-Base SQuAD fine-tuning, seq 384"),
    Anchor("bert-base", "bert-base-squad384", "lambda-pt-H100", 408, 172, True, "lambda-pt",
           "BERT-Base SQuAD fine-tuning, seq 384"),
    Anchor("bert-base", "bert-base-squad384", "srifty-T4", 31.8, 8, False, "dle-bert-tf",
           "BERT-Base FP32 inference at seq 384, batch 8: T4 31.8 vs V100 146.28 sentences/s (TensorFlow "
           "20.06); the T4/V100 ratio is applied to the V100 calibration",
           ref_context="lambda-pt-V100", ref_samples_s=146.28, forward_only=True),
    Anchor("dlrm", "dlrm-mlperf", "dle-V100-32GB", 494_000, 32768, True, "dle-dlrm",
           "MLPerf-sized DLRM (dim 128) with sparse embedding updates: calibrates the per-sample cost only"),
]

# Models without a published throughput anywhere borrow k from related models.
K_DONORS = {
    "xlm": ["bert-base"],
    "squeezenet1.1": ["resnet18", "resnet50", "resnet101", "resnet152", "vgg16", "vgg19", "alexnet",
                      "inception-v3", "resnext50"],
    "shufflenet-v2-x2.0": ["resnext50"],
}
K_DONOR_NOTE = {
    "xlm": "no published XLM throughput: BERT-Base's factor on this GPU (same transformer family, Hugging Face)",
    "squeezenet1.1": "no published SqueezeNet throughput: geometric mean of the other CNNs' factors on this GPU",
    "shufflenet-v2-x2.0": "no published ShuffleNet throughput: ResNeXt's factor on this GPU (grouped/depthwise "
                          "convolutions run further below the roofline than dense ones)",
}

# Srifty Table 3, per instance -> per GPU.
GPUS_PER_INSTANCE = {"V100": 4, "M60": 2, "T4": 1}
TABLE3_PER_INSTANCE = {
    # model: (p3.8xlarge, g3.8xlarge, g4dn.8xlarge); None = not run
    "alexnet": (8192, 2048, 2048),
    "resnet18": (2048, 512, 512),
    "resnet50": (512, 64, 128),  # g4dn: "64/128" for 2xlarge/8xlarge; the 8xlarge is the case-study one
    "vgg16": (512, 64, 128),
    "vgg19": (512, 64, 128),
    "resnext50": (512, 64, 64),
    "squeezenet1.1": (2048, 512, 512),
    "shufflenet-v2-x2.0": (1024, 256, 256),
    "inception-v3": (512, 128, 128),
    "bert-base": (256, 64, 64),
    "xlm": (512, 64, 128),
    "dlrm": (512 * 1024, None, 128 * 1024),
}
# Models not in Table 3: activation memory scaled from a family member by analytic activation size.
MEMORY_DONOR = {"resnet101": "resnet50", "resnet152": "resnet50"}

# Host launch floor (calibrated on the DLE ResNet-50 batch-1 FP32 inference latency, V100 and T4).
HOST_FLOOR_RN50_S = {"V100": 0.01037, "T4": 0.0107}
# Host bookkeeping of a foreach optimizer step per parameter tensor, calibrated on ResNet-50's measured step
# (SOURCES["thrifty-h100"]; nothing published times a PyTorch 2 optimizer step). ResNet-18's and AlexNet's
# measured steps on the same machine are left out of it: tests/test_derived_vs_measured.py checks them.
STEP_MEASURED_DEVICE, STEP_MEASURED_S = "H100", 0.000880533

PUBLISHED_PARAMS = {
    "resnet18": (11_689_512, "torchvision"), "resnet50": (25_557_032, "torchvision"),
    "resnet101": (44_549_160, "torchvision"), "resnet152": (60_192_808, "torchvision"),
    "vgg16": (138_357_544, "torchvision"), "vgg19": (143_667_240, "torchvision"),
    "alexnet": (61_100_840, "torchvision"), "inception-v3": (27_161_264, "torchvision"),
    "shufflenet-v2-x2.0": (7_393_996, "torchvision"), "resnext50": (25_028_904, "torchvision"),
    "squeezenet1.1": (1_235_496, "torchvision"),
    "bert-base": (108_310_272 + 768 * 2 + 2, "bert-params"),  # + 2-label classifier head
}
PUBLISHED_GMACS = {
    "resnet18": 1.81, "resnet50": 4.09, "resnet101": 7.80, "resnet152": 11.51, "vgg16": 15.47,
    "vgg19": 19.63, "alexnet": 0.71, "inception-v3": 5.71, "shufflenet-v2-x2.0": 0.58,
    "resnext50": 4.23, "squeezenet1.1": 0.35,
}

# Criteo Terabyte cardinalities (MLPerf DLRM reference) and our hashing cap.
CRITEO_TB_CARDINALITIES = [
    39884406, 39043, 17289, 7420, 20263, 3, 7120, 1543, 63, 38532951, 2953546, 403346, 10, 2208, 11938, 155,
    4, 976, 14, 39979771, 25641295, 39664984, 585935, 12972, 108, 36,
]
DLRM_MAX_IND_RANGE = 1_000_000
# Srifty does not state sequence lengths. With the T4/V100 BERT efficiency published by NVIDIA, its Case 5
# iteration times (which include the allreduce) are only reachable with BERT at <= 64 tokens and XLM at
# <= ~40 tokens (see the README's cross-checks); we take 64 and 32. Table 3's memory limits are used
# directly, independently of these lengths.
BERT_SEQ = 64
XLM_SEQ = 32

# ---------------------------------------------------------------------------
# Architecture enumeration
# ---------------------------------------------------------------------------


@dataclass
class Op:
    name: str
    kind: str
    params: int = 0
    tensors: int = 0
    macs: float = 0.0  # forward multiply-adds per sample
    bytes: float = 0.0  # forward memory traffic per sample
    wbytes_f: float = 0.0  # forward traffic per batch (weights)
    wbytes_b: float = 0.0  # backward traffic per batch (weights read, weight gradient written)
    dgrad: bool = True  # backward also computes the gradient of the input
    out_elems: float = 0.0  # output elements per sample (activation size)
    grad_params: int | None = None  # gradient size if it differs from params (tied weights)
    bias: bool = False  # a conv/linear with a bias: its backward also reduces the bias gradient
    winograd: bool = False  # a dense 3x3 stride-1 convolution: cuDNN runs it with Winograd in FP32 math

    @property
    def bwd_launches(self) -> int:
        """Kernels the backward pass launches for this op (PyTorch eager on CUDA): a conv or linear
        launches one for the weight gradient, one for the input gradient unless nothing upstream needs
        it, one for the bias gradient; a matmul of two activations one per operand; layer norm one for
        the input and one for gamma/beta; a concatenation none (its backward slices views); a loss two
        (nll_loss_backward, log_softmax_backward); every other op one (batch norm, pooling, the
        elementwise ops: for a residual add, the accumulation where its two gradients meet)."""
        if self.kind in ("conv", "linear"):
            return 1 + int(self.dgrad) + int(self.bias)
        return {"matmul": 2, "layernorm": 2, "cat": 0, "loss": 2}.get(self.kind, 1)


@dataclass
class Net:
    name: str
    input_desc: str
    optimizer: str  # "sgd-momentum" | "adamw" | "sgd"
    ops: list[Op] = field(default_factory=list)

    def add(self, op: Op) -> Op:
        self.ops.append(op)
        return op

    # -- CNN helpers (shapes are (c, h, w) per sample) -------------------------
    def conv(self, name, x, cout, k, s=1, p=0, groups=1, bias=False, dgrad=True):
        c, h, w = x
        kh, kw = (k, k) if isinstance(k, int) else k
        ph, pw = (p, p) if isinstance(p, int) else p
        ho, wo = (h + 2 * ph - kh) // s + 1, (w + 2 * pw - kw) // s + 1
        params = cout * (c // groups) * kh * kw + (cout if bias else 0)
        macs = cout * ho * wo * (c // groups) * kh * kw
        out = cout * ho * wo
        self.add(Op(name, "conv", params, 2 if bias else 1, macs, 4 * (c * h * w + out), 4 * params,
                    8 * params, dgrad, out, bias=bias, winograd=(kh, kw, s, groups) == (3, 3, 1, 1)))
        return (cout, ho, wo)

    def bn(self, name, x):
        c = x[0]
        n = x[0] * x[1] * x[2]
        self.add(Op(name, "bn", 2 * c, 2, 0, 4 * 3 * n, 8 * c, 16 * c, True, n))
        return x

    def elem(self, name, x, n_in=1, kind="elementwise"):
        n = x if isinstance(x, (int, float)) else x[0] * x[1] * x[2]
        self.add(Op(name, kind, bytes=4 * (n_in + 1) * n, out_elems=n))
        return x

    def pool(self, name, x, k, s, p=0, ceil=False, out=None):
        c, h, w = x
        if out is None:
            f = math.ceil if ceil else math.floor
            ho = int(f((h + 2 * p - k) / s)) + 1
            wo = int(f((w + 2 * p - k) / s)) + 1
        else:
            ho, wo = out
        n_out = c * ho * wo
        self.add(Op(name, "pool", bytes=4 * (c * h * w + n_out), out_elems=n_out))
        return (c, ho, wo)

    def linear(self, name, n_in, n_out, tokens=1, bias=True, dgrad=True, tied=False):
        w = n_in * n_out
        params = (0 if tied else w) + (n_out if bias else 0)
        self.add(Op(name, "linear", params, (0 if tied else 1) + (1 if bias else 0), tokens * w,
                    4 * tokens * (n_in + n_out), 4 * w, 8 * w, dgrad, tokens * n_out, bias=bias))
        return n_out

    def matmul(self, name, macs, n_in, n_out):
        self.add(Op(name, "matmul", macs=macs, bytes=4 * (n_in + n_out), out_elems=n_out))

    def layernorm(self, name, tokens, h):
        n = tokens * h
        self.add(Op(name, "layernorm", 2 * h, 2, 0, 4 * 3 * n, 8 * h, 16 * h, True, n))

    def embedding(self, name, rows, dim, tokens, dense_grad=True):
        params = rows * dim
        n = tokens * dim
        self.add(Op(name, "embedding", params, 1, 0, 4 * 2 * n, 0, 4 * params if dense_grad else 0, False, n))

    # -- totals -----------------------------------------------------------
    @property
    def params(self) -> int:
        return sum(op.params for op in self.ops)

    @property
    def tensors(self) -> int:
        return sum(op.tensors for op in self.ops)

    @property
    def macs(self) -> float:
        return sum(op.macs for op in self.ops)

    @property
    def act_elems(self) -> float:
        return sum(op.out_elems for op in self.ops)


def _size(x):
    return x[0] * x[1] * x[2]


def build_resnet(name, block, layers, groups=1, width_per_group=64, input_desc="3x224x224 image"):
    """torchvision ResNet / ResNeXt (v1.5: the stride sits in the 3x3 convolution)."""
    net = Net(name, input_desc, "sgd-momentum")
    x = net.conv("conv1", (3, 224, 224), 64, 7, 2, 3, dgrad=False)
    x = net.bn("bn1", x)
    net.elem("relu", x)
    x = net.pool("maxpool", x, 3, 2, 1)
    inplanes = 64
    for li, (planes, n) in enumerate(zip([64, 128, 256, 512], layers), start=1):
        for bi in range(n):
            stride = 2 if (li > 1 and bi == 0) else 1
            pre = f"layer{li}.{bi}"
            xin = x
            if block == "basic":
                out = planes
                x = net.conv(f"{pre}.conv1", x, planes, 3, stride, 1)
                x = net.bn(f"{pre}.bn1", x)
                net.elem(f"{pre}.relu1", x)
                x = net.conv(f"{pre}.conv2", x, planes, 3, 1, 1)
                x = net.bn(f"{pre}.bn2", x)
            else:
                width = int(planes * (width_per_group / 64.0)) * groups
                out = planes * 4
                x = net.conv(f"{pre}.conv1", x, width, 1)
                x = net.bn(f"{pre}.bn1", x)
                net.elem(f"{pre}.relu1", x)
                x = net.conv(f"{pre}.conv2", x, width, 3, stride, 1, groups=groups)
                x = net.bn(f"{pre}.bn2", x)
                net.elem(f"{pre}.relu2", x)
                x = net.conv(f"{pre}.conv3", x, out, 1)
                x = net.bn(f"{pre}.bn3", x)
            if stride != 1 or inplanes != out:
                d = net.conv(f"{pre}.downsample.0", xin, out, 1, stride)
                net.bn(f"{pre}.downsample.1", d)
            net.elem(f"{pre}.add", x, n_in=2)
            net.elem(f"{pre}.relu", x)
            inplanes = out
    x = net.pool("avgpool", x, 0, 1, out=(1, 1))
    net.linear("fc", x[0], 1000)
    net.elem("loss", 1000, kind="loss")
    return net


def build_vgg(name, cfg):
    net = Net(name, "3x224x224 image", "sgd-momentum")
    x = (3, 224, 224)
    i = 0
    first = True
    for v in cfg:
        if v == "M":
            x = net.pool(f"features.{i}", x, 2, 2)
            i += 1
        else:
            x = net.conv(f"features.{i}", x, v, 3, 1, 1, bias=True, dgrad=not first)
            first = False
            net.elem(f"features.{i + 1}", x)
            i += 2
    x = net.pool("avgpool", x, 0, 1, out=(7, 7))
    n = _size(x)
    net.linear("classifier.0", n, 4096)
    net.elem("classifier.1", 4096)
    net.elem("classifier.2", 4096)
    net.linear("classifier.3", 4096, 4096)
    net.elem("classifier.4", 4096)
    net.elem("classifier.5", 4096)
    net.linear("classifier.6", 4096, 1000)
    net.elem("loss", 1000, kind="loss")
    return net


def build_alexnet():
    net = Net("alexnet", "3x224x224 image", "sgd-momentum")
    x = net.conv("features.0", (3, 224, 224), 64, 11, 4, 2, bias=True, dgrad=False)
    net.elem("features.1", x)
    x = net.pool("features.2", x, 3, 2)
    x = net.conv("features.3", x, 192, 5, 1, 2, bias=True)
    net.elem("features.4", x)
    x = net.pool("features.5", x, 3, 2)
    x = net.conv("features.6", x, 384, 3, 1, 1, bias=True)
    net.elem("features.7", x)
    x = net.conv("features.8", x, 256, 3, 1, 1, bias=True)
    net.elem("features.9", x)
    x = net.conv("features.10", x, 256, 3, 1, 1, bias=True)
    net.elem("features.11", x)
    x = net.pool("features.12", x, 3, 2)
    x = net.pool("avgpool", x, 0, 1, out=(6, 6))
    net.elem("classifier.0", _size(x))
    net.linear("classifier.1", _size(x), 4096)
    net.elem("classifier.2", 4096)
    net.elem("classifier.3", 4096)
    net.linear("classifier.4", 4096, 4096)
    net.elem("classifier.5", 4096)
    net.linear("classifier.6", 4096, 1000)
    net.elem("loss", 1000, kind="loss")
    return net


def build_squeezenet11():
    net = Net("squeezenet1.1", "3x224x224 image", "sgd-momentum")
    x = net.conv("features.0", (3, 224, 224), 64, 3, 2, bias=True, dgrad=False)
    net.elem("features.1", x)
    x = net.pool("features.2", x, 3, 2, ceil=True)

    def fire(idx, x, squeeze, e1, e3):
        pre = f"features.{idx}"
        s = net.conv(f"{pre}.squeeze", x, squeeze, 1, bias=True)
        net.elem(f"{pre}.squeeze_activation", s)
        a = net.conv(f"{pre}.expand1x1", s, e1, 1, bias=True)
        net.elem(f"{pre}.expand1x1_activation", a)
        b = net.conv(f"{pre}.expand3x3", s, e3, 3, 1, 1, bias=True)
        net.elem(f"{pre}.expand3x3_activation", b)
        out = (e1 + e3, a[1], a[2])
        net.elem(f"{pre}.cat", out, kind="cat")
        return out

    x = fire(3, x, 16, 64, 64)
    x = fire(4, x, 16, 64, 64)
    x = net.pool("features.5", x, 3, 2, ceil=True)
    x = fire(6, x, 32, 128, 128)
    x = fire(7, x, 32, 128, 128)
    x = net.pool("features.8", x, 3, 2, ceil=True)
    x = fire(9, x, 48, 192, 192)
    x = fire(10, x, 48, 192, 192)
    x = fire(11, x, 64, 256, 256)
    x = fire(12, x, 64, 256, 256)
    net.elem("classifier.0", x)
    x = net.conv("classifier.1", x, 1000, 1, bias=True)
    net.elem("classifier.2", x)
    x = net.pool("classifier.3", x, 0, 1, out=(1, 1))
    net.elem("loss", 1000, kind="loss")
    return net


def build_shufflenet_v2_x2():
    net = Net("shufflenet-v2-x2.0", "3x224x224 image", "sgd-momentum")
    x = net.conv("conv1.0", (3, 224, 224), 24, 3, 2, 1, dgrad=False)
    x = net.bn("conv1.1", x)
    net.elem("conv1.2", x)
    x = net.pool("maxpool", x, 3, 2, 1)
    inp = 24
    for si, (repeats, oup) in enumerate(zip([4, 8, 4], [244, 488, 976]), start=2):
        for r in range(repeats):
            pre = f"stage{si}.{r}"
            stride = 2 if r == 0 else 1
            bf = oup // 2
            c, h, w = x
            if stride > 1:
                b1 = net.conv(f"{pre}.branch1.0", x, inp, 3, stride, 1, groups=inp)
                b1 = net.bn(f"{pre}.branch1.1", b1)
                b1 = net.conv(f"{pre}.branch1.2", b1, bf, 1)
                b1 = net.bn(f"{pre}.branch1.3", b1)
                net.elem(f"{pre}.branch1.4", b1)
                xin = x
            else:
                xin = (bf, h, w)  # the second half of the channels (chunk: a view)
            b2 = net.conv(f"{pre}.branch2.0", xin, bf, 1)
            b2 = net.bn(f"{pre}.branch2.1", b2)
            net.elem(f"{pre}.branch2.2", b2)
            b2 = net.conv(f"{pre}.branch2.3", b2, bf, 3, stride, 1, groups=bf)
            b2 = net.bn(f"{pre}.branch2.4", b2)
            b2 = net.conv(f"{pre}.branch2.5", b2, bf, 1)
            b2 = net.bn(f"{pre}.branch2.6", b2)
            net.elem(f"{pre}.branch2.7", b2)
            x = (oup, b2[1], b2[2])
            net.elem(f"{pre}.cat", x, kind="cat")
            net.elem(f"{pre}.channel_shuffle", x, kind="shuffle")
            inp = oup
    x = net.conv("conv5.0", x, 2048, 1)
    x = net.bn("conv5.1", x)
    net.elem("conv5.2", x)
    x = net.pool("mean", x, 0, 1, out=(1, 1))
    net.linear("fc", 2048, 1000)
    net.elem("loss", 1000, kind="loss")
    return net


def build_inception_v3():
    """torchvision Inception v3 at 299x299, training mode (with the auxiliary classifier)."""
    net = Net("inception-v3", "3x299x299 image", "sgd-momentum")

    def basic(name, x, cout, k, s=1, p=0, dgrad=True):
        y = net.conv(f"{name}.conv", x, cout, k, s, p, dgrad=dgrad)
        net.bn(f"{name}.bn", y)
        net.elem(f"{name}.relu", y)
        return y

    def cat(name, parts):
        out = (sum(p[0] for p in parts), parts[0][1], parts[0][2])
        net.elem(f"{name}.cat", out, kind="cat")
        return out

    x = basic("Conv2d_1a_3x3", (3, 299, 299), 32, 3, 2, dgrad=False)
    x = basic("Conv2d_2a_3x3", x, 32, 3)
    x = basic("Conv2d_2b_3x3", x, 64, 3, 1, 1)
    x = net.pool("maxpool1", x, 3, 2)
    x = basic("Conv2d_3b_1x1", x, 80, 1)
    x = basic("Conv2d_4a_3x3", x, 192, 3)
    x = net.pool("maxpool2", x, 3, 2)

    def inc_a(n, x, pool_features):
        b1 = basic(f"{n}.branch1x1", x, 64, 1)
        b5 = basic(f"{n}.branch5x5_1", x, 48, 1)
        b5 = basic(f"{n}.branch5x5_2", b5, 64, 5, 1, 2)
        b3 = basic(f"{n}.branch3x3dbl_1", x, 64, 1)
        b3 = basic(f"{n}.branch3x3dbl_2", b3, 96, 3, 1, 1)
        b3 = basic(f"{n}.branch3x3dbl_3", b3, 96, 3, 1, 1)
        bp = net.pool(f"{n}.avg_pool", x, 3, 1, 1)
        bp = basic(f"{n}.branch_pool", bp, pool_features, 1)
        return cat(n, [b1, b5, b3, bp])

    def inc_b(n, x):
        b3 = basic(f"{n}.branch3x3", x, 384, 3, 2)
        bd = basic(f"{n}.branch3x3dbl_1", x, 64, 1)
        bd = basic(f"{n}.branch3x3dbl_2", bd, 96, 3, 1, 1)
        bd = basic(f"{n}.branch3x3dbl_3", bd, 96, 3, 2)
        bp = net.pool(f"{n}.max_pool", x, 3, 2)
        return cat(n, [b3, bd, bp])

    def inc_c(n, x, c7):
        b1 = basic(f"{n}.branch1x1", x, 192, 1)
        b7 = basic(f"{n}.branch7x7_1", x, c7, 1)
        b7 = basic(f"{n}.branch7x7_2", b7, c7, (1, 7), 1, (0, 3))
        b7 = basic(f"{n}.branch7x7_3", b7, 192, (7, 1), 1, (3, 0))
        bd = basic(f"{n}.branch7x7dbl_1", x, c7, 1)
        bd = basic(f"{n}.branch7x7dbl_2", bd, c7, (7, 1), 1, (3, 0))
        bd = basic(f"{n}.branch7x7dbl_3", bd, c7, (1, 7), 1, (0, 3))
        bd = basic(f"{n}.branch7x7dbl_4", bd, c7, (7, 1), 1, (3, 0))
        bd = basic(f"{n}.branch7x7dbl_5", bd, 192, (1, 7), 1, (0, 3))
        bp = net.pool(f"{n}.avg_pool", x, 3, 1, 1)
        bp = basic(f"{n}.branch_pool", bp, 192, 1)
        return cat(n, [b1, b7, bd, bp])

    def inc_d(n, x):
        b3 = basic(f"{n}.branch3x3_1", x, 192, 1)
        b3 = basic(f"{n}.branch3x3_2", b3, 320, 3, 2)
        b7 = basic(f"{n}.branch7x7x3_1", x, 192, 1)
        b7 = basic(f"{n}.branch7x7x3_2", b7, 192, (1, 7), 1, (0, 3))
        b7 = basic(f"{n}.branch7x7x3_3", b7, 192, (7, 1), 1, (3, 0))
        b7 = basic(f"{n}.branch7x7x3_4", b7, 192, 3, 2)
        bp = net.pool(f"{n}.max_pool", x, 3, 2)
        return cat(n, [b3, b7, bp])

    def inc_e(n, x):
        b1 = basic(f"{n}.branch1x1", x, 320, 1)
        b3 = basic(f"{n}.branch3x3_1", x, 384, 1)
        b3a = basic(f"{n}.branch3x3_2a", b3, 384, (1, 3), 1, (0, 1))
        b3b = basic(f"{n}.branch3x3_2b", b3, 384, (3, 1), 1, (1, 0))
        bd = basic(f"{n}.branch3x3dbl_1", x, 448, 1)
        bd = basic(f"{n}.branch3x3dbl_2", bd, 384, 3, 1, 1)
        bda = basic(f"{n}.branch3x3dbl_3a", bd, 384, (1, 3), 1, (0, 1))
        bdb = basic(f"{n}.branch3x3dbl_3b", bd, 384, (3, 1), 1, (1, 0))
        bp = net.pool(f"{n}.avg_pool", x, 3, 1, 1)
        bp = basic(f"{n}.branch_pool", bp, 192, 1)
        return cat(n, [b1, b3a, b3b, bda, bdb, bp])

    x = inc_a("Mixed_5b", x, 32)
    x = inc_a("Mixed_5c", x, 64)
    x = inc_a("Mixed_5d", x, 64)
    x = inc_b("Mixed_6a", x)
    x = inc_c("Mixed_6b", x, 128)
    x = inc_c("Mixed_6c", x, 160)
    x = inc_c("Mixed_6d", x, 160)
    x = inc_c("Mixed_6e", x, 192)
    a = net.pool("AuxLogits.avg_pool", x, 5, 3)
    a = basic("AuxLogits.conv0", a, 128, 1)
    a = basic("AuxLogits.conv1", a, 768, 5)
    a = net.pool("AuxLogits.adaptive_avg_pool", a, 0, 1, out=(1, 1))
    net.linear("AuxLogits.fc", 768, 1000)
    x = inc_d("Mixed_7a", x)
    x = inc_e("Mixed_7b", x)
    x = inc_e("Mixed_7c", x)
    x = net.pool("avgpool", x, 0, 1, out=(1, 1))
    net.elem("dropout", x)
    net.linear("fc", 2048, 1000)
    net.elem("loss", 2000, kind="loss")
    return net


def _attention_block(net, pre, names, s, h, heads):
    """Self-attention: q/k/v projections, scores, softmax, dropout, context, output projection."""
    q, k, v, o = names
    net.linear(f"{pre}{q}", h, h, tokens=s)
    net.linear(f"{pre}{k}", h, h, tokens=s)
    net.linear(f"{pre}{v}", h, h, tokens=s)
    net.matmul(f"{pre}scores", s * s * h, 2 * s * h, heads * s * s)
    net.elem(f"{pre}softmax", heads * s * s)
    net.elem(f"{pre}attn_dropout", heads * s * s)
    net.matmul(f"{pre}context", s * s * h, heads * s * s + s * h, s * h)
    net.linear(f"{pre}{o}", h, h, tokens=s)


def build_bert(seq=BERT_SEQ, head="cls", name="bert-base", vocab=28996, layers=12, h=768, heads=12, ffn=3072):
    """Hugging Face BertForSequenceClassification (BERT-Base-Cased, 2 labels) or BertForQuestionAnswering."""
    net = Net(name, f"sequence of {seq} tokens", "adamw")
    s = seq
    e = "bert.embeddings."
    net.embedding(f"{e}word_embeddings", vocab, h, s)
    net.embedding(f"{e}position_embeddings", 512, h, s)
    net.embedding(f"{e}token_type_embeddings", 2, h, s)
    net.elem(f"{e}sum", s * h, n_in=3)
    net.layernorm(f"{e}LayerNorm", s, h)
    net.elem(f"{e}dropout", s * h)
    for i in range(layers):
        pre = f"bert.encoder.layer.{i}."
        _attention_block(net, f"{pre}attention.", ("self.query", "self.key", "self.value", "output.dense"),
                         s, h, heads)
        net.elem(f"{pre}attention.output.dropout", s * h)
        net.elem(f"{pre}attention.output.residual", s * h, n_in=2)
        net.layernorm(f"{pre}attention.output.LayerNorm", s, h)
        net.linear(f"{pre}intermediate.dense", h, ffn, tokens=s)
        net.elem(f"{pre}intermediate.gelu", s * ffn)
        net.linear(f"{pre}output.dense", ffn, h, tokens=s)
        net.elem(f"{pre}output.dropout", s * h)
        net.elem(f"{pre}output.residual", s * h, n_in=2)
        net.layernorm(f"{pre}output.LayerNorm", s, h)
    if head == "cls":
        net.linear("bert.pooler.dense", h, h)
        net.elem("bert.pooler.tanh", h)
        net.elem("dropout", h)
        net.linear("classifier", h, 2)
        net.elem("loss", 2, kind="loss")
    else:
        net.linear("qa_outputs", h, 2, tokens=s)
        net.elem("loss", 2 * s, kind="loss")
    return net


def build_xlm(seq=XLM_SEQ, vocab=64699, layers=6, h=1024, heads=8, ffn=4096, n_langs=2, max_pos=512):
    """Hugging Face XLMWithLMHeadModel for xlm-clm-ende-1024 (output projection tied to the embeddings)."""
    net = Net("xlm", f"sequence of {seq} tokens", "adamw")
    s = seq
    t = "transformer."
    emb = Op(f"{t}embeddings", "embedding", vocab * h, 1, 0, 4 * 2 * s * h, 0, 4 * vocab * h, False, s * h)
    net.add(emb)
    net.embedding(f"{t}position_embeddings", max_pos, h, s)
    net.embedding(f"{t}lang_embeddings", n_langs, h, s)
    net.elem(f"{t}sum", s * h, n_in=3)
    net.layernorm(f"{t}layer_norm_emb", s, h)
    net.elem(f"{t}dropout", s * h)
    for i in range(layers):
        _attention_block(net, f"{t}attentions.{i}.", ("q_lin", "k_lin", "v_lin", "out_lin"), s, h, heads)
        net.elem(f"{t}attentions.{i}.dropout", s * h)
        net.elem(f"{t}attentions.{i}.residual", s * h, n_in=2)
        net.layernorm(f"{t}layer_norm1.{i}", s, h)
        net.linear(f"{t}ffns.{i}.lin1", h, ffn, tokens=s)
        net.elem(f"{t}ffns.{i}.gelu", s * ffn)
        net.linear(f"{t}ffns.{i}.lin2", ffn, h, tokens=s)
        net.elem(f"{t}ffns.{i}.dropout", s * h)
        net.elem(f"{t}ffns.{i}.residual", s * h, n_in=2)
        net.layernorm(f"{t}layer_norm2.{i}", s, h)
    net.linear("pred_layer.proj", h, vocab, tokens=s, tied=True)
    net.elem("pred_layer.cross_entropy", s * vocab, n_in=2, kind="loss")
    # the tied embedding receives its gradient from both ends: ready when the lookup's part arrives (last)
    emb.grad_params = vocab * h
    return net


def dlrm_tables(cap=DLRM_MAX_IND_RANGE):
    return [min(c, cap) for c in CRITEO_TB_CARDINALITIES]


def build_dlrm(variant="dlrm"):
    """facebookresearch/dlrm DLRM_Net, data-parallel with dense embedding gradients (as Srifty ran it)."""
    if variant == "dlrm":
        dim, bot, top, rows, dense = 64, [13, 512, 256, 64], [512, 512, 256, 1], dlrm_tables(), True
    else:  # MLPerf-sized model of the NVIDIA DLE benchmark (sparse embedding updates)
        dim, bot, top, rows, dense = 128, [13, 512, 256, 128], [1024, 1024, 512, 256, 1], \
            dlrm_tables(40_000_000), False
    net = Net(variant, "13 dense + 26 categorical features", "sgd")
    for j, (a, b) in enumerate(zip(bot, bot[1:])):
        net.linear(f"bot_l.{2 * j}", a, b)
        net.elem(f"bot_l.{2 * j + 1}", b)
    for i, r in enumerate(rows):
        net.embedding(f"emb_l.{i}", r, dim, 1, dense_grad=dense)
    f = len(rows) + 1
    net.matmul("interact.bmm", f * f * dim, f * dim, f * f)
    n_top = dim + f * (f - 1) // 2
    net.elem("interact.tril_cat", n_top)
    dims = [n_top] + top
    for j, (a, b) in enumerate(zip(dims, dims[1:])):
        net.linear(f"top_l.{2 * j}", a, b)
        net.elem(f"top_l.{2 * j + 1}", b)
    net.elem("loss", 1, kind="loss")
    return net


def build_model(name: str) -> Net:
    builders = {
        "resnet18": lambda: build_resnet("resnet18", "basic", [2, 2, 2, 2]),
        "resnet50": lambda: build_resnet("resnet50", "bottleneck", [3, 4, 6, 3]),
        "resnet101": lambda: build_resnet("resnet101", "bottleneck", [3, 4, 23, 3]),
        "resnet152": lambda: build_resnet("resnet152", "bottleneck", [3, 8, 36, 3]),
        "resnext50": lambda: build_resnet("resnext50", "bottleneck", [3, 4, 6, 3], 32, 4),
        "resnext101-32x4d": lambda: build_resnet("resnext101-32x4d", "bottleneck", [3, 4, 23, 3], 32, 4),
        "vgg16": lambda: build_vgg("vgg16", [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
                                             512, 512, 512, "M"]),
        "vgg19": lambda: build_vgg("vgg19", [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512, 512, 512,
                                             512, "M", 512, 512, 512, 512, "M"]),
        "alexnet": build_alexnet,
        "squeezenet1.1": build_squeezenet11,
        "shufflenet-v2-x2.0": build_shufflenet_v2_x2,
        "inception-v3": build_inception_v3,
        "bert-base": lambda: build_bert(),
        "bert-base-squad384": lambda: build_bert(384, "qa", "bert-base-squad384"),
        "xlm": build_xlm,
        "dlrm": lambda: build_dlrm("dlrm"),
        "dlrm-mlperf": lambda: build_dlrm("dlrm-mlperf"),
    }
    return builders[name]()


def reference_params(model: str) -> tuple[int, str]:
    """Published parameter count, or for xlm/dlrm the closed form of the published config."""
    if model in PUBLISHED_PARAMS:
        return PUBLISHED_PARAMS[model]
    if model == "xlm":
        v, h, n, langs, pos = 64699, 1024, 6, 2, 512
        layer = 4 * (h * h + h) + 2 * (2 * h) + (h * 4 * h + 4 * h) + (4 * h * h + h)
        return v * h + pos * h + langs * h + 2 * h + n * layer + v, "xlm-config"
    if model == "dlrm":
        def mlp(sizes):
            return sum(a * b + b for a, b in zip(sizes, sizes[1:]))
        return sum(dlrm_tables()) * 64 + mlp([13, 512, 256, 64]) + mlp([415, 512, 512, 256, 1]), "dlrm-config"
    raise KeyError(model)


def check_architectures() -> None:
    """Parameter totals within 1% of the published counts; MACs within 3% of published figures."""
    for m in MODELS:
        net = build_model(m)
        ref, _ = reference_params(m)
        assert abs(net.params - ref) <= 0.01 * ref, f"{m}: {net.params} parameters, published {ref}"
        if m in PUBLISHED_GMACS:
            g = net.macs / 1e9
            assert abs(g - PUBLISHED_GMACS[m]) <= 0.03 * PUBLISHED_GMACS[m], f"{m}: {g:.3f} GMACs"


# ---------------------------------------------------------------------------
# Timing model
# ---------------------------------------------------------------------------


@dataclass
class Timing:
    """Per-op coefficients of one network on one device with efficiency eta_c."""

    comp_f: list[float]  # s per sample, compute-bound forward
    mem_f: list[float]  # s per sample, memory-bound forward
    w_f: list[float]  # s per batch forward
    comp_b: list[float]
    mem_b: list[float]
    w_b: list[float]
    floor_f: float
    floor_b: float
    step: float

    @classmethod
    def of(cls, net: Net, dev: Device, eta_c: float, k_host: float, k_opt: float) -> "Timing":
        pc = eta_c * dev.peak_tflops * 1e12
        pm = ETA_M * dev.bw_gbs * 1e9
        cf, mf, wf, cb, mb, wb = [], [], [], [], [], []
        for op in net.ops:
            macs = op.macs / (WINOGRAD_MAC_REDUCTION if op.winograd and dev.math == "FP32" else 1.0)
            cf.append(2 * macs / pc)
            mf.append(op.bytes / pm)
            wf.append(op.wbytes_f / pm)
            cb.append((4 if op.dgrad else 2) * macs / pc)
            mb.append(2 * op.bytes / pm)
            wb.append(op.wbytes_b / pm)
        floor_f = len(net.ops) * k_host
        floor_b = sum(op.bwd_launches for op in net.ops) * k_host
        return cls(cf, mf, wf, cb, mb, wb, floor_f, floor_b, step_seconds(net, dev, k_opt))

    def op_fwd(self, batch: float, k: float) -> list[float]:
        return [max(batch * c, batch * m + w) / k for c, m, w in zip(self.comp_f, self.mem_f, self.w_f)]

    def op_bwd(self, batch: float, k: float) -> list[float]:
        return [max(batch * c, batch * m + w) / k for c, m, w in zip(self.comp_b, self.mem_b, self.w_b)]

    def fwd(self, batch: float, k: float) -> float:
        return max(self.floor_f, sum(self.op_fwd(batch, k)))

    def bwd(self, batch: float, k: float) -> float:
        return max(self.floor_b, sum(self.op_bwd(batch, k)))

    def iteration(self, batch: float, k: float, include_step: bool) -> float:
        return self.fwd(batch, k) + self.bwd(batch, k) + (self.step if include_step else 0.0)


# DRAM traffic per parameter of torch.optim's foreach step (the default on CUDA since PyTorch 2.0), pass
# by pass: SGD-momentum mul_(bufs) 8 + add_(bufs, grads) 12 + add_(params, bufs) 12; AdamW lerp_ 12, mul_ 8,
# addcmul_ 12, weight decay mul_ 8, sqrt 8, div_ 8, add_ 8, addcdiv_ 16; SGD add_(params, grads) 12.
# zero_grad(set_to_none=True), PyTorch 2's default, frees the gradients: no traffic.
OPT_BYTES_PER_PARAM = {"sgd-momentum": 32, "adamw": 80, "sgd": 12}
STATE_BYTES_PER_PARAM = {"sgd-momentum": 16, "adamw": 20, "sgd": 12}  # weights, grads, state, DDP buckets


def step_seconds(net: Net, dev: Device, k_opt: float) -> float:
    """Optimizer step: a foreach step launches a few kernels over all parameter tensors at once, so it is
    memory-bound over the parameters, plus the host's per-tensor bookkeeping (`k_opt` per parameter
    tensor: the step's and zero_grad's Python loops over the parameters), not one launch per tensor."""
    return OPT_BYTES_PER_PARAM[net.optimizer] * net.params / (ETA_M * dev.bw_gbs * 1e9) + net.tensors * k_opt


def solve_increasing(f, target: float, lo: float = 1e-4, hi: float = 1e4) -> float:
    """x in [lo, hi] with f(x) = target for a decreasing f (bisection in log space)."""
    flo, fhi = f(lo), f(hi)
    if not (fhi <= target <= flo):
        raise ValueError(f"target {target:.6g} outside [{fhi:.6g}, {flo:.6g}]")
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if f(mid) > target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return math.sqrt(lo * hi)


@dataclass
class Calibration:
    k_host: float
    k_opt: float  # host bookkeeping of the optimizer step per parameter tensor
    eta_c: dict[str, float]  # context -> eta_c
    k_anchor: list[tuple[Anchor, float]]  # anchor -> fitted k
    dlrm_host_s: float  # per-iteration host constant of the DLRM reference implementation
    checks: dict[str, Any]


def calibrate() -> Calibration:
    rn50 = build_model("resnet50")
    # 1. host floor per operator: batch-1 inference is flat (host-bound) for ResNet-50
    n_ops = len(rn50.ops)
    k_host = sum(HOST_FLOOR_RN50_S.values()) / len(HOST_FLOOR_RN50_S) / n_ops
    # 1b. optimizer bookkeeping per parameter tensor: the measured foreach step beyond its DRAM traffic
    step_dev = DEVICES[STEP_MEASURED_DEVICE]
    k_opt = (STEP_MEASURED_S - step_seconds(rn50, step_dev, 0.0)) / rn50.tensors
    assert k_opt > 0, "the measured ResNet-50 step is shorter than its DRAM traffic"
    # 2. eta_c per context from ResNet-50
    eta: dict[str, float] = {}
    for c in CONTEXTS.values():
        dev = DEVICES[c.device]
        target = c.rn50_batch / c.rn50_img_s
        eta[c.name] = solve_increasing(
            lambda e: Timing.of(rn50, dev, e, k_host, k_opt).iteration(c.rn50_batch, 1.0, c.include_step),  # noqa: B023
            target,
            1e-3, 10.0)
    # batch-1 inference must be host-bound for the floor calibration to hold
    for dname, ctx_name in (("V100", "lambda-pt-V100"), ("T4", "srifty-T4")):
        t = Timing.of(rn50, DEVICES[dname], eta[ctx_name], k_host, k_opt)
        assert sum(t.op_fwd(1, 1.0)) < t.floor_f, f"ResNet-50 batch 1 on {dname} is not host-bound"
    # 3. per-model factors
    fitted: list[tuple[Anchor, float]] = []
    for a in ANCHORS:
        if a.ref_context is not None:
            continue
        net = build_model(a.variant)
        ctx = CONTEXTS[a.context]
        t = Timing.of(net, DEVICES[ctx.device], eta[a.context], k_host, k_opt)
        if a.model == "dlrm":
            t.step = 0.0  # sparse embedding updates of the DLE model: per-sample cost only
        k = solve_increasing(lambda kk: t.iteration(a.batch, kk, a.include_step),  # noqa: B023 - solved here
                             a.batch / a.samples_s)
        assert t.fwd(a.batch, k) > t.floor_f, f"anchor {a} is latency-bound: cannot calibrate"
        fitted.append((a, k))
    # relative anchors: k(here) = k(reference GPU) * published ratio / ratio predicted with k = 1
    for a in ANCHORS:
        if a.ref_context is None:
            continue
        assert a.ref_samples_s is not None  # a relative anchor gives the ratio's reference throughput
        net = build_model(a.variant)
        ref_hw = HARDWARE[CONTEXTS[a.ref_context].device]
        k_ref = _geomean([k for b, k in fitted
                          if b.model == a.model and HARDWARE[CONTEXTS[b.context].device] == ref_hw])

        def predicted(ctx_name: str, net=net, a=a) -> float:
            c = CONTEXTS[ctx_name]
            t = Timing.of(net, DEVICES[c.device], eta[ctx_name], k_host, k_opt)
            return a.batch / (t.fwd(a.batch, 1.0) if a.forward_only else t.iteration(a.batch, 1.0, a.include_step))

        k = k_ref * (a.samples_s / a.ref_samples_s) / (predicted(a.context) / predicted(a.ref_context))
        fitted.append((a, k))
    # 4. DLRM: the per-iteration constant of Srifty's run on T4 beyond the modeled step
    dlrm = build_model("dlrm")
    k_dlrm = _geomean([k for a, k in fitted if a.model == "dlrm"])
    t = Timing.of(dlrm, DEVICES["T4"], eta["srifty-T4"], k_host, k_opt)
    modeled = t.iteration(1024, k_dlrm, True)
    dlrm_host = max(0.0, 0.12 - modeled)
    checks = {"k_host_s": k_host, "k_opt_s": k_opt, "rn50_ops": n_ops, "dlrm_T4_1024_modeled_s": modeled}
    return Calibration(k_host, k_opt, eta, fitted, dlrm_host, checks)


def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _k_by_family(cal: Calibration, model: str) -> dict[str, list[tuple[Anchor, float]]]:
    out: dict[str, list[tuple[Anchor, float]]] = {}
    for a, k in cal.k_anchor:
        if a.model == model:
            out.setdefault(HARDWARE[CONTEXTS[a.context].device], []).append((a, k))
    return out


def model_factor(cal: Calibration, model: str, device: str) -> tuple[float, str, list[Anchor]]:
    """The per-model factor k for `model` on `device`, how it was chosen, and the anchors used."""
    if model == "resnet50":
        return 1.0, "ResNet-50 defines each GPU's calibration (k = 1)", []
    fam = _k_by_family(cal, model)
    if model == "dlrm":
        (a, k), = fam["V100"]
        return k, ("per-sample cost from the MLPerf-sized DLE DLRM on V100; per-iteration host constant from "
                   "Srifty's DLRM on T4"), [a]
    if device in fam:  # published on this very GPU (family)
        used = fam[device]
        how = "published throughput of this model on this GPU"
        refs = [(a.ref_context, a.forward_only) for a, _ in used if a.ref_context is not None]  # relative anchors
        if refs:
            ref_context, forward_only = refs[0]
            ref_hw = HARDWARE[CONTEXTS[ref_context].device]
            how = (f"published {device}/{ref_hw} throughput ratio of this model (same source"
                   f"{', inference' if forward_only else ''}) applied to its {ref_hw} factor")
            used = used + fam.get(ref_hw, [])
        return _geomean([k for b, k in used if HARDWARE[CONTEXTS[b.context].device] == device]), how, \
            [a for a, _ in used]
    if fam:
        ref = FAMILY_REF.get(model)
        for hw in PREFERENCE[device]:
            if hw not in fam:
                continue
            used = fam[hw]
            k_own = _geomean([k for _, k in used])
            if ref is None:
                return k_own, (f"no published throughput on this GPU: factor of the published anchor on {hw} "
                               "(throughput scaled by the ratio of achieved FLOP/s and bytes/s)"), [a for a, _ in used]
            ref_here, _, ref_used = model_factor(cal, ref, device)
            ref_there = 1.0 if ref == "resnet50" else _geomean([k for _, k in _k_by_family(cal, ref)[hw]])
            k = ref_here * k_own / ref_there
            return k, (f"no published throughput on this GPU: ratio to {ref} on {hw}, applied to {ref} here "
                       "(scaled by the ratio of achieved FLOP/s and bytes/s)"), [a for a, _ in used] + ref_used
        raise AssertionError(model)
    donors = K_DONORS[model]
    ks, used_all = [], []
    for d in donors:
        k, _, donor_used = model_factor(cal, d, device)
        ks.append(k)
        used_all += [a for a in donor_used if a not in used_all]
    return _geomean(ks), K_DONOR_NOTE[model], used_all


# ---------------------------------------------------------------------------
# Memory model -> max_batch
# ---------------------------------------------------------------------------


def table3_per_gpu(model: str, device: str) -> int | None:
    if model not in TABLE3_PER_INSTANCE or device not in GPUS_PER_INSTANCE:
        return None
    v = TABLE3_PER_INSTANCE[model][["V100", "M60", "T4"].index(device)]
    return None if v is None else v // GPUS_PER_INSTANCE[device]


def usable_bytes(dev: Device) -> float:
    return (dev.mem_gib - MEM_RESERVE_GIB) * GIB


def static_bytes(net: Net) -> float:
    return STATE_BYTES_PER_PARAM[net.optimizer] * net.params


def activation_bytes_per_sample(model: str) -> tuple[float, str]:
    """Per-sample activation memory consistent with every Srifty Table 3 entry of the model."""
    if model in MEMORY_DONOR:
        donor = MEMORY_DONOR[model]
        a, _ = activation_bytes_per_sample(donor)
        ratio = build_model(model).act_elems / build_model(donor).act_elems
        return a * ratio, f"{donor}'s Table 3 calibration scaled by analytic activation size ({ratio:.3f}x)"
    net = build_model(model)
    lo, hi = 0.0, math.inf
    for d in ("V100", "M60", "T4"):
        b = table3_per_gpu(model, d)
        if b is None:
            continue
        free = usable_bytes(DEVICES[d]) - static_bytes(net)
        lo, hi = max(lo, free / (2 * b)), min(hi, free / b)  # b fits, 2b does not
    assert lo < hi, f"{model}: Srifty Table 3 entries are inconsistent with the memory model"
    unit, div = ("MiB", 2 ** 20) if hi >= 2 ** 20 else ("KiB", 2 ** 10)
    return math.sqrt(lo * hi), (f"{math.sqrt(lo * hi) / div:.1f} {unit} of activations per sample, consistent "
                                f"with all Srifty Table 3 entries of the model ({lo / div:.1f}-{hi / div:.1f} {unit})")


def max_batch(model: str, device: str) -> tuple[int, str]:
    b = table3_per_gpu(model, device)
    if b is not None:
        return b, "Srifty Table 3 (per instance / GPUs per instance)"
    net = build_model(model)
    a, how = activation_bytes_per_sample(model)
    free = usable_bytes(DEVICES[device]) - static_bytes(net)
    n = int(free // a)
    assert n >= 1, f"{model} does not fit on {device}"
    return 2 ** int(math.log2(n)), f"memory model: {how}; rounded down to a power of two"


# ---------------------------------------------------------------------------
# Profiles
# ---------------------------------------------------------------------------


def _r(x: float) -> float:
    return float(f"{x:.6g}")


def _cite(key: str) -> str:
    return f"[{key}] {SOURCES[key]}"


def derive(cal: Calibration, model: str, device: str) -> dict[str, Any]:
    net = build_model(model)
    dev = DEVICES[device]
    ctx = CONTEXTS[DEVICE_CONTEXT[device]]
    eta_c = cal.eta_c[ctx.name]
    k, k_how, anchors = model_factor(cal, model, device)
    t = Timing.of(net, dev, eta_c, cal.k_host, cal.k_opt)
    step = t.step + (cal.dlrm_host_s if model == "dlrm" else 0.0)
    mb, mb_how = max_batch(model, device)
    batches = [2 ** i for i in range(int(math.log2(mb)) + 1)]
    points = []
    for b in batches:
        f, w = t.fwd(b, k), t.bwd(b, k)
        points.append({"batch": b, "forward_s": _r(f), "backward_s": _r(w), "forward_sd_s": _r(CV * f),
                       "backward_sd_s": _r(CV * w), "repeats": 1})
    # layers in backward order, ready when backward has processed them (GPU time at max_batch)
    bwd_ops = t.op_bwd(mb, k)
    total = sum(bwd_ops)
    done = 0.0
    layers = []
    for op, dt in zip(reversed(net.ops), reversed(bwd_ops)):
        done += dt
        g = op.grad_params if op.grad_params is not None else op.params
        if g > 0:
            layers.append({"name": op.name, "grad_bytes": 4 * g, "ready_frac": round(min(1.0, done / total), 6)})
    # published sources used
    keys = [dev.spec, ctx.source, "gpu-memory", "dle-rn50", "thrifty-h100", "winograd", "srifty-var", "srifty-fig5"]
    keys += [a.source for a in anchors]
    keys += [reference_params(model)[1]]
    if table3_per_gpu(model, device) is not None or model in TABLE3_PER_INSTANCE or model in MEMORY_DONOR:
        keys.append("srifty-t3")
    if model == "dlrm":
        keys.append("srifty-case4")
    if model in ("bert-base", "xlm", "dlrm"):
        keys.append({"bert-base": "bert-params", "xlm": "xlm-config", "dlrm": "dlrm-config"}[model])
    if device == "A10G":
        keys.append("spec-a10")
    if dev.math == "TF32":
        keys.append("tf32-defaults")
    seen: list[str] = []
    for key in keys:
        if key not in seen:
            seen.append(key)
    inputs = [_cite(key) for key in seen]
    thr_b = batches[-1]
    notes = (f"Derived, not measured: FP32 training ({dev.math} math on {device}), {net.input_desc}. "
             f"Per-layer roofline with eta_c={eta_c:.3f} calibrated on ResNet-50 in context {ctx.name} "
             f"({ctx.rn50_img_s:.4g} img/s, {ctx.software}); per-model factor k={k:.3f}: {k_how}. "
             f"Host floor {t.floor_f * 1e3:.2f} ms forward / {t.floor_b * 1e3:.2f} ms backward "
             f"({len(net.ops)} operators / {sum(op.bwd_launches for op in net.ops)} backward kernels x "
             f"{cal.k_host * 1e6:.1f} us); step: foreach {net.optimizer}, {net.tensors} parameter tensors x "
             f"{cal.k_opt * 1e6:.2f} us host. max_batch: {mb_how}. "
             f"sd = {CV:.1%} of the mean; repeats=1 because nothing was measured.")
    anchor_rows = [{"variant": a.variant, "context": a.context, "device": CONTEXTS[a.context].device,
                    "samples_s": _r(a.samples_s), "batch": a.batch, "source": a.source} for a in anchors]
    extra = {
        "precision": (f"FP32 storage, {dev.math} math" if dev.math == "FP32" else
                      "FP32 storage, TF32 math for convolutions and matmuls (stock PyTorch >= 1.12 keeps matmuls "
                      "in FP32 unless torch.set_float32_matmul_precision('high'))"),
        "input": net.input_desc,
        "parameters": net.params,
        "forward_gmacs_per_sample": _r(net.macs / 1e9),
        "eta_c": _r(eta_c),
        "eta_m": ETA_M,
        "calibration_context": ctx.name,
        "k_model": _r(k),
        "k_model_basis": k_how,
        "anchors": anchor_rows,
        "throughput_at_max_batch_samples_s": _r(thr_b / (points[-1]["forward_s"] + points[-1]["backward_s"] + step)),
        "cv": CV,
    }
    if model == "dlrm":
        extra["host_constant_s"] = _r(cal.dlrm_host_s)
        extra["max_ind_range"] = DLRM_MAX_IND_RANGE
    return {
        "format": "thrifty.compute_profile/1",
        "model": model,
        "device": device,
        "provenance": {"kind": "derived", "script": SCRIPT, "inputs": inputs, "date": DERIVED_DATE,
                       "notes": notes},
        "max_batch": mb,
        "step_s": _r(step),
        "points": points,
        "layers": layers,
        "extra": extra,
    }


def cross_checks(cal: Calibration) -> list[tuple[str, str, str]]:
    """Published figures NOT used for calibration, against what the derived model says."""
    rows: list[tuple[str, str, str]] = []

    def timing(model: str, device: str, net: Net | None = None) -> tuple[Timing, float]:
        net = net or build_model(model)
        c = DEVICE_CONTEXT[device]
        k = model_factor(cal, model, device)[0]
        return Timing.of(net, DEVICES[device], cal.eta_c[c], cal.k_host, cal.k_opt), k

    t, k = timing("resnet50", "T4")
    rows.append(("ResNet-50 FP32 inference, T4, batch 64 (dle-rn50)", "428 img/s",
                 f"{64 / t.fwd(64, k):.0f} img/s (forward pass of training)"))
    t, k = timing("resnet50", "V100")
    rows.append(("ResNet-50 FP32 inference, V100, batch 256 (dle-rn50)", "1261 img/s",
                 f"{256 / t.fwd(256, k):.0f} img/s (forward pass of training)"))
    rows.append(("ResNet-50 FP32 training, V100 16GB (dle-rn50)", "367 img/s",
                 f"{128 / t.iteration(128, k, True):.0f} img/s at batch 128"))
    t, k = timing("resnet50", "A100")
    rows.append(("ResNet-50 TF32 training, A100 80GB (dle-rn50)", "938 img/s",
                 f"{256 / t.iteration(256, k, True):.0f} img/s at batch 256 (A100 40GB SXM4 of p4d: 1555 GB/s)"))
    rows.append(("ResNet-50 TF32 training, A100 40GB PCIe, batch 360 (lambda-pt)", "882 img/s",
                 f"{256 / t.iteration(256, k, True):.0f} img/s at batch 256 (A100 40GB SXM4)"))
    rnx = build_model("resnext101-32x4d")
    rows.append(("ResNeXt-101 32x4d FP32 inference latency at batch 1, V100 / T4 (dle-rnx101)", "21.02 / 17.88 ms",
                 f"{len(rnx.ops) * cal.k_host * 1e3:.1f} ms (host floor, {len(rnx.ops)} operators)"))
    t, k = timing("bert-base", "T4", build_bert(128))
    rows.append(("BERT-Base FP32 inference, seq 128, batch 8, T4 (dle-bert-tf)", "98.9 sentences/s",
                 f"{8 / t.fwd(8, k):.0f} sentences/s (forward pass of training)"))
    t, k = timing("resnet50", "T4")
    rows.append(("ResNet50 16g4dn@8: 0.13 s/iter incl. allreduce over 16 VMs (srifty Case 1)", "0.13 s",
                 f"{t.iteration(8, k, True):.3f} s compute on one T4 at batch 8"))
    rows.append(("ResNet50 2g4dn@64: 0.58 s/iter incl. allreduce (srifty Case 1)", "0.58 s",
                 f"{t.iteration(64, k, True):.3f} s compute on one T4 at batch 64"))
    t, k = timing("xlm", "T4")
    rows.append(("XLM 4g4dn@128: 2.18 s/iter incl. allreduce (srifty Case 5, 0.174 cents at $0.72/h)", "2.18 s",
                 f"{t.iteration(128, k, True):.2f} s compute on one T4 at batch 128"))
    rows.append(("XLM 8g4dn@64: 1.23 s/iter incl. allreduce (srifty Case 5, 0.197 cents)", "1.23 s",
                 f"{t.iteration(64, k, True):.2f} s compute on one T4 at batch 64"))
    t, k = timing("xlm", "M60")
    rows.append(("XLM 8g3@64 (32 per M60): 1.45 s/iter incl. allreduce (srifty Case 5, 0.223 cents at $0.69/h)",
                 "1.45 s", f"{t.iteration(32, k, True):.2f} s compute on one M60 at batch 32"))
    t, k = timing("bert-base", "M60")
    rows.append(("BERT 16g3@64 (32 per M60): 1.12 s/iter incl. allreduce (srifty Case 5, 0.343 cents)", "1.12 s",
                 f"{t.iteration(32, k, True):.2f} s compute on one M60 at batch 32"))
    t, k = timing("bert-base", "T4")
    rows.append(("BERT 16g4dn@64: 1.30 s/iter incl. allreduce (srifty Case 5, 0.416 cents)", "1.30 s",
                 f"{t.iteration(64, k, True):.2f} s compute on one T4 at batch 64"))
    t, k = timing("vgg16", "M60")
    rows.append(("VGG16 8g3@64 (32 per M60): 1.11 s/iter incl. allreduce (srifty Case 2)", "1.11 s",
                 f"{t.iteration(32, k, True):.2f} s compute on one M60 at batch 32"))
    return rows


def _fmt(x: float) -> str:
    return f"{x:,.0f}" if x >= 1000 else f"{x:.4g}"


def readme(cal: Calibration, rows: list[dict[str, Any]]) -> str:
    lines = [
        "# Derived compute profiles",
        "",
        "GPU compute profiles (`thrifty.compute_profile/1`) of well-known models, **derived** from published",
        "facts by `datasets/scripts/derive_profiles.py`, not measured. Regenerate them (and this file) with:",
        "",
        "    python datasets/scripts/derive_profiles.py            # writes datasets/profiles/derived/",
        "    python datasets/scripts/derive_profiles.py --out DIR  # anywhere else",
        "",
        "`tests/test_derived_profiles.py` checks that a fresh run reproduces the shipped files byte for byte.",
        "The method is described at the top of the script; in short:",
        "",
        "- **Layers and parameters**: each architecture is enumerated analytically (torchvision and Hugging Face",
        "  module names). Totals are asserted within 1% of published counts (torchvision docs; KerasHub BERT",
        "  presets) and forward MACs within 3% of torchvision's figures. `xlm` and `dlrm` have no published",
        "  total: their reference is the closed form of the published configuration.",
        "- **Latency**: per-layer roofline (FLOPs against peak FP32, or TF32 tensor on Ampere/Hopper/Ada, and",
        "  bytes against memory bandwidth). In FP32 math a dense 3x3 stride-1 convolution counts the",
        "  multiplications of Winograd's F(2x2,3x3), 16 of the direct 36 (cuDNN runs it so; Lavin and Gray",
        "  2016); on TF32 tensor cores the direct ones. Each GPU's achieved fraction of peak (`eta_c`) is",
        "  calibrated so ResNet-50 reproduces its published training throughput (an effective fraction: still",
        "  above 1 for TensorFlow on V100, whose other algorithms, FFT and larger Winograd tiles, save more);",
        "  each model's factor `k` so that it reproduces",
        "  its own published throughput(s). Where a model has no published figure on a GPU, it keeps the `k` of",
        "  its anchors on other GPUs: the anchor is scaled by the ratio of achieved FLOP/s (and bytes/s).",
        "- **Small batches**: a pass takes at least its kernel launches x `K_HOST` (host launch floor): one",
        "  per operator forward; backward the kernels the autograd engine launches (weight, input and bias",
        "  gradients of a conv or linear, one per batch norm, pooling or elementwise op: about 1.3x the",
        "  forward's count for ResNets, 1.7x for AlexNet, not 2x: the 1:2 split is one of FLOPs, not of",
        f"  launches). `K_HOST` = {cal.k_host * 1e6:.1f} us, calibrated on the flat batch-1..4 FP32 inference latency",
        "  of ResNet-50 in NVIDIA's DeepLearningExamples (V100 10.37 ms, T4 10.7 ms).",
        "- **Forward/backward split** 1:2 of the GPU work (backward computes input and weight gradients).",
        "- **Optimizer step** (`step_s`; SGD-momentum for CNNs, AdamW for transformers, SGD for DLRM) as",
        "  PyTorch 2 runs it on CUDA by default: a foreach step over all parameter tensors at once, memory-bound",
        "  (32, 80, 12 bytes per parameter: its passes; `zero_grad` frees the gradients), plus",
        f"  {cal.k_opt * 1e6:.2f} us of host bookkeeping per parameter tensor, calibrated on ResNet-50's measured step",
        "  on an H100 (0.881 ms, `thrifty-h100`; nothing published times a PyTorch 2 step). Not one launch",
        "  per tensor: that gave ResNet-50 a 10 ms step on an H100, 11x the measured.",
        f"- **Variance**: sd = {CV:.1%} of the mean (Srifty 2.2: near-normal, max/min up to 1.1x over 760 VMs).",
        "- **max_batch** (per GPU): Srifty Table 3 on V100, M60 and T4 (per-instance values divided by 4, 2, 1",
        "  GPUs); on other GPUs a memory model (weights, gradients, optimizer state, DDP buckets, plus a",
        "  per-sample activation size chosen consistent with every Table 3 entry of the model), rounded down to",
        "  a power of two. Profiled batches are 1, 2, 4, ... up to max_batch.",
        "- **ready_frac**: cumulative backward time from the output side up to the layer, over the total.",
        "",
        "Precision is FP32 as in Srifty (PyTorch 1.5): on A10G, L4, A100 and H100 this means TF32 tensor-core",
        "math for convolutions and matmuls alike, which is what the published throughputs on those GPUs",
        "measured (NGC containers and TensorFlow allow TF32 for both). Stock PyTorch >= 1.12 allows it for",
        "convolutions only (`torch.backends.cudnn.allow_tf32` True, `torch.backends.cuda.matmul.allow_tf32`",
        "False): there, matmul-bound models (BERT, XLM, DLRM, VGG's and AlexNet's classifiers) run slower than",
        "these profiles unless TF32 matmuls are enabled (`torch.set_float32_matmul_precision('high')`; source",
        "`tf32-defaults`); no published figure calibrates FP32 CUDA-core matmuls on these GPUs, so that case",
        "is not derived. Model inputs:",
        f"224x224 images (Inception v3: 299x299); BERT-Base-Cased sequence classification at {BERT_SEQ} tokens and",
        f"XLM CLM En-De 1024 (Hugging Face `XLMWithLMHeadModel`) at {XLM_SEQ} tokens: Srifty does not state its",
        "sequence lengths, and with NVIDIA's published T4/V100 BERT efficiency its Case 5 iteration times (which",
        "include the allreduce) are reachable only with BERT at <= 64 and XLM at <= ~40 tokens (see the",
        "cross-checks below; at 128 tokens BERT alone would take 2.1 s per iteration on a T4 where Srifty",
        "measured 1.3 s including communication). DLRM: the Criteo Terabyte configuration of",
        f"facebookresearch/dlrm (dim 64) with every table hashed to {DLRM_MAX_IND_RANGE:,} rows (455.8M parameters,",
        "1.8 GB of dense gradients): small enough to train data-parallel as Srifty did, and consistent with its",
        "Case 4 (1 T4 at batch 1024 beats 16 T4s by 250x in cost: a gradient of about 2 GB per iteration) and",
        "with Table 3 (128K samples per 16 GB GPU).",
        "",
        "## Anchors (published throughputs used)",
        "",
        "| model | GPU (context) | throughput | batch | source |",
        "| --- | --- | ---: | ---: | --- |",
    ]
    for c in CONTEXTS.values():
        lines.append(f"| resnet50 | {c.device} ({c.name}, {c.software}) | {_fmt(c.rn50_img_s)} img/s | "
                     f"{c.rn50_batch} | {c.source} |")
    for a in ANCHORS:
        variant = "" if a.variant == a.model else f" (as {a.variant})"
        c = CONTEXTS[a.context]
        unit = "samples/s" if a.model in ("bert-base", "dlrm") else "img/s"
        rel = ""
        if a.ref_context is not None:
            assert a.ref_samples_s is not None  # a relative anchor gives the ratio's reference throughput
            rel = (f" ({'inference; ' if a.forward_only else ''}used as the ratio to "
                   f"{_fmt(a.ref_samples_s)} on {CONTEXTS[a.ref_context].device}, same source)")
        lines.append(f"| {a.model}{variant} | {c.device} ({a.context}) | {_fmt(a.samples_s)} {unit}{rel} | "
                     f"{a.batch} | {a.source} |")
    lines.append(f"| dlrm | T4 (srifty-T4) | 0.12 s/iter | 1024 | srifty-case4 (host constant "
                 f"{cal.dlrm_host_s * 1e3:.1f} ms added to step_s) |")
    lines += [
        "",
        "Not sourced, derived instead:",
        "",
        "- Models without any published training throughput: `xlm` (BERT-Base's factor on the same GPU),",
        "  `squeezenet1.1` (geometric mean of the other CNNs' factors), `shufflenet-v2-x2.0` (ResNeXt's factor:",
        "  grouped and depthwise convolutions), `resnext50` (anchored on ResNeXt-101 32x4d, same blocks).",
        "- GPUs without any published training throughput: `L4` and `A10G` (the A10's ResNet-50 efficiency and",
        "  per-model factors applied to their own peak and bandwidth; the A10G's tensor peak comes from a",
        "  third-party comparison). These two are the least certain profiles.",
        "- A model with published figures on some GPUs only keeps its factor from the most similar anchored GPU",
        "  (same math: FP32 CUDA cores vs TF32 tensor cores, then generation), or its ratio to a family member",
        "  (`vgg19` to `vgg16`, ResNets to ResNet-50) where that member is anchored on the target GPU.",
        "- M60: the published M60 figures are Torch7 / cuDNN 5.1 at batch 16 (2016), and Srifty's own AlexNet",
        "  Case 3 for AlexNet; transformers on M60 use the V100's factor.",
        "- DLRM: the per-sample cost comes from NVIDIA's MLPerf-sized DLRM on V100; the per-iteration host",
        "  constant (Python data loading of the reference implementation) from Srifty's Case 4 on T4 and is",
        "  assumed the same on every GPU.",
        "",
        "## Profiles",
        "",
        "Anchor: the published throughput(s) the profile reproduces or is scaled from (model variant @ GPU",
        "context: samples/s [source]); ResNet-50 on the same GPU fixes the GPU's efficiency for every model.",
        "",
        "| model | device | max batch | derived throughput at max batch | anchor(s) | basis |",
        "| --- | --- | ---: | ---: | --- | --- |",
    ]
    for r in rows:
        ex = r["extra"]
        ctx = CONTEXTS[ex["calibration_context"]]
        anchors = [f"resnet50@{ctx.name} {_fmt(ctx.rn50_img_s)}/s [{ctx.source}]"] if r["model"] == "resnet50" else [
            f"{a['variant']}@{a['context']} {_fmt(a['samples_s'])}/s [{a['source']}]" for a in ex["anchors"]]
        lines.append(f"| {r['model']} | {r['device']} | {r['max_batch']} | "
                     f"{_fmt(ex['throughput_at_max_batch_samples_s'])}/s | {'; '.join(anchors)} | "
                     f"{ex['k_model_basis']} |")
    lines += [
        "",
        "## Cross-checks (published figures not used for calibration)",
        "",
        "Srifty's multi-VM figures include the allreduce, so they bound the compute time from above.",
        "",
        "| published | value | derived |",
        "| --- | ---: | --- |",
    ]
    for what, value, derived in cross_checks(cal):
        lines.append(f"| {what} | {value} | {derived} |")
    lines += measured_comparison(rows)
    lines += ["", "## Sources", ""]
    for key, text in SOURCES.items():
        lines.append(f"- `{key}`: {text}")
    lines.append("")
    return "\n".join(lines)


MEASURED_DIR = Path(__file__).resolve().parents[1] / "profiles" / "measured"
BATCH_RANGES = [("1-16 (host-bound)", 1, 16), ("32-64", 32, 64), ("128 and up", 128, math.inf)]


def measured_comparison(rows: list[dict[str, Any]]) -> list[str]:
    """README lines comparing each derived profile that has a measured one of the same model and device
    (`datasets/profiles/measured/`) with it: iteration (forward + backward + step) ratio per batch range,
    optimizer step and max_batch. Not an input of the derivation, except ResNet-50's step on the H100."""
    lines = ["", "## Against measured profiles", "",
             "Derived profiles with a measured one of the same model and device (`datasets/profiles/measured/`,",
             "e.g. the H100 check of `benchmarks/gpu_check.sh`); ratio = measured / derived iteration (forward +",
             "backward + step). ResNet-50's measured step on the H100 calibrates the step's per-tensor host cost",
             "(`thrifty-h100`); nothing else here is an input. The measured max_batch is the exact largest batch",
             "(or the search's cap), the derived one the largest power of two that fits.", "",
             "| model | device | " + " | ".join(f"batch {name}" for name, _, _ in BATCH_RANGES)
             + " | step (measured / derived) | max_batch (measured / derived) |",
             "| --- | --- | " + " | ".join("---:" for _ in BATCH_RANGES) + " | ---: | ---: |"]
    found = False
    unrounded: list[tuple[str, float]] = []
    for r in rows:
        path = MEASURED_DIR / f"{r['model']}__{r['device']}.json"
        if not path.is_file():
            continue
        found = True
        measured = json.loads(path.read_text())
        m = {p["batch"]: p["forward_s"] + p["backward_s"] + measured["step_s"] for p in measured["points"]}
        d = {p["batch"]: p["forward_s"] + p["backward_s"] + r["step_s"] for p in r["points"]}
        cells = []
        for _, lo, hi in BATCH_RANGES:
            ratios = [m[b] / d[b] for b in sorted(set(m) & set(d)) if lo <= b <= hi]
            cells.append(f"{min(ratios):.2f}-{max(ratios):.2f}" if ratios else "-")
        source = measured.get("extra", {}).get("max_batch_source", "")
        if table3_per_gpu(r["model"], r["device"]) is None:
            net = build_model(r["model"])
            per_sample, _ = activation_bytes_per_sample(r["model"])
            unrounded.append((f"{r['model']} on {r['device']}",
                              (usable_bytes(DEVICES[r["device"]]) - static_bytes(net)) / per_sample))
        lines.append(f"| {r['model']} | {r['device']} | {' | '.join(cells)} | "
                     f"{measured['step_s'] * 1e3:.3f} / {r['step_s'] * 1e3:.3f} ms | "
                     f"{measured['max_batch']}{f' ({source})' if source else ''} / {r['max_batch']} |")
    if not found:
        return []
    lines += ["",
              "What remains (H100): at batches 32-64 a pass is neither host- nor GPU-bound and takes longer than",
              "the larger of the two, which the model takes; ResNet-50's published H100 throughput (NGC PyTorch",
              "22.10) is about 5% below what torch 2.11 measured; AlexNet's factor comes from TensorFlow on an",
              "A100 and its classifier ran FP32 matmuls in the measurement (stock PyTorch), TF32 in the anchors.",
              "The memory model before rounding to a power of two: "
              + ", ".join(f"{m} {n:.0f}" for m, n in unrounded) + " samples."]
    return lines


def generate(out_dir: str | Path = DEFAULT_OUT) -> list[Path]:
    """Write every derived profile and README.md into `out_dir`; return the profile paths."""
    from thrifty.core.io import atomic_write_text
    from thrifty.perfmodels.profile import load_profile, parse_profile, save_profile

    check_architectures()
    cal = calibrate()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths, rows = [], []
    for model in MODELS:
        for device in DEVICES_OUT:
            data = derive(cal, model, device)
            profile = parse_profile(data, source=f"{model}__{device}")
            path = out / f"{model}__{device}.json"
            save_profile(profile, path)
            load_profile(path)
            paths.append(path)
            rows.append(data)
    atomic_write_text(out / "README.md", readme(cal, rows))
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=str(DEFAULT_OUT), help="output folder (default: datasets/profiles/derived)")
    args = p.parse_args(argv)
    paths = generate(args.out)
    print(f"wrote {len(paths)} profiles and README.md to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
