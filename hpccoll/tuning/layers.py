"""Backward passes of four published models as tuning workloads, and the analytic
device/network model the simulator uses.

Gradient sizes come from the architectures (parameter counts match the published
totals; tests check them): ResNet-50 and VGG-16 as in torchvision, BERT-base as
``bert-base-uncased``'s BertModel, GPT-2 small with its tied embedding.  One entry per
parameterized layer (weight and bias together: one backward kernel produces both), in
reverse registration order, which is the order DDP buckets them in.

Compute time of an entry: the backward work between the previous gradient and this
one, from a FLOP model: a convolution or matmul costs 2x its forward FLOPs (input and
weight gradients) at ``Device.flops``; a normalization or embedding layer is memory
bound (``NORM_PASSES`` passes over its activations at ``Device.mem_bw``); every entry
costs at least ``Device.kernel_floor``.  Parameter-free work that matters (attention
scores, the tied GPT-2 output projection) is charged to the next gradient produced.
Elementwise activations and pooling are left out.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from .model import Workload
from .profile import Profile

BYTES_PER_PARAM = 4      # fp32 gradients
NORM_PASSES = 4          # read x, read dy, read x again for the statistics, write dx


@dataclass(frozen=True)
class Device:
    """A V100-class GPU, as a model: not a measurement."""
    name: str = "V100-class GPU (model)"
    sms: int = 80                    # streaming multiprocessors
    flops: float = 12e12             # sustained conv/matmul FLOP/s in backward
    mem_bw: float = 800e9            # sustained bytes/s for memory-bound layers
    kernel_floor: float = 10e-6      # least backward time of one layer (launches, small kernels)


@dataclass(frozen=True)
class Network:
    """Ring allreduce across ``nodes`` GPUs, one per node, over a ``link_gbps`` network.
    One block moves at most ``block_gbps``: more blocks are needed to fill faster links
    (Libra's premise).  Each block occupies one SM that compute then lacks, so compute
    overlapped with an allreduce of b blocks is slowed by sms / (sms - b)."""
    link_gbps: float = 100.0
    nodes: int = 8
    block_gbps: float = 25.0
    step_latency: float = 5e-6       # per ring step (2 (nodes - 1) steps)
    blocks: tuple = (1, 2, 4, 8, 16)


def model_profile(net: Network, dev: Device = Device()) -> Profile:
    """T(bytes, b) = 2(N-1) latency + 2(N-1)/N bytes / min(link, b x block rate);
    slowdown(b) = sms / (sms - b).  Marked as a model in ``sources``."""
    sizes = np.array([0] + [1 << k for k in range(10, 33, 2)], dtype=np.int64)
    blocks = np.array(net.blocks, dtype=np.int64)
    n = net.nodes
    rate = np.minimum(net.link_gbps, blocks * net.block_gbps) * 1e9 / 8     # bytes/s
    alpha = 2 * (n - 1) * net.step_latency
    comm = alpha + (2 * (n - 1) / n) * sizes[:, None] / rate[None, :]
    slow = dev.sms / (dev.sms - blocks.astype(float))
    attrs = {f"network.{k}": v for k, v in asdict(net).items()}
    attrs.update({f"device.{k}": v for k, v in asdict(dev).items()})
    attrs["formula"] = ("T = 2(N-1) step_latency + 2(N-1)/N bytes / min(link, b block_gbps); "
                        "slowdown = sms / (sms - b)")
    return Profile(sizes, blocks, comm, slow, {"comm_time": "model", "slowdown": "model"}, attrs)


# -- architectures: forward-order lists of (name, params, kind, work) ----------------
# kind "mm": work = forward FLOPs; "mem": work = activation elements; "free": work =
# forward FLOPs of parameter-free compute, charged to the next gradient in backward.

def _conv(name, cin, cout, k, hout, batch, bias=False):
    return (name, k * k * cin * cout + (cout if bias else 0), "mm",
            2.0 * k * k * cin * cout * hout * hout * batch)


def _bn(name, c, h, batch):
    return (name, 2 * c, "mem", float(c * h * h * batch))


def resnet50(batch: int = 32):
    L = [_conv("conv1", 3, 64, 7, 112, batch), _bn("bn1", 64, 112, batch)]
    cin, res = 64, 56
    for li, (planes, blocks, stride) in enumerate([(64, 3, 1), (128, 4, 2), (256, 6, 2),
                                                    (512, 3, 2)], start=1):
        for bi in range(blocks):
            s = stride if bi == 0 else 1
            out = res // s
            p = f"layer{li}.{bi}."
            L += [_conv(p + "conv1", cin, planes, 1, res, batch), _bn(p + "bn1", planes, res, batch),
                  _conv(p + "conv2", planes, planes, 3, out, batch), _bn(p + "bn2", planes, out, batch),
                  _conv(p + "conv3", planes, 4 * planes, 1, out, batch),
                  _bn(p + "bn3", 4 * planes, out, batch)]
            if bi == 0:
                L += [_conv(p + "downsample.0", cin, 4 * planes, 1, out, batch),
                      _bn(p + "downsample.1", 4 * planes, out, batch)]
            cin, res = 4 * planes, out
    L.append(("fc", 2048 * 1000 + 1000, "mm", 2.0 * 2048 * 1000 * batch))
    return L


def vgg16(batch: int = 32):
    cfg = [64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512, "M"]
    L, cin, res, i = [], 3, 224, 0
    for v in cfg:
        if v == "M":
            res //= 2
        else:
            L.append(_conv(f"features.{i}", cin, v, 3, res, batch, bias=True))
            cin = v
        i += 1 if v == "M" else 2
    for j, (a, b) in enumerate([(512 * 7 * 7, 4096), (4096, 4096), (4096, 1000)]):
        L.append((f"classifier.{3 * j}", a * b + b, "mm", 2.0 * a * b * batch))
    return L


def _linear(name, a, b, tokens):
    return (name, a * b + b, "mm", 2.0 * a * b * tokens)


def bert_base(batch: int = 32, seq: int = 128):
    d, ff, tok = 768, 3072, batch * seq
    L = [("embeddings.word_embeddings", 30522 * d, "mem", float(tok * d)),
         ("embeddings.position_embeddings", 512 * d, "mem", float(tok * d)),
         ("embeddings.token_type_embeddings", 2 * d, "mem", float(tok * d)),
         ("embeddings.LayerNorm", 2 * d, "mem", float(tok * d))]
    for i in range(12):
        p = f"encoder.layer.{i}."
        L += [_linear(p + "attention.self.query", d, d, tok),
              _linear(p + "attention.self.key", d, d, tok),
              _linear(p + "attention.self.value", d, d, tok),
              (p + "attention.scores", 0, "free", 4.0 * seq * seq * d * batch),
              _linear(p + "attention.output.dense", d, d, tok),
              (p + "attention.output.LayerNorm", 2 * d, "mem", float(tok * d)),
              _linear(p + "intermediate.dense", d, ff, tok),
              _linear(p + "output.dense", ff, d, tok),
              (p + "output.LayerNorm", 2 * d, "mem", float(tok * d))]
    L.append(_linear("pooler.dense", d, d, batch))
    return L


def gpt2_small(batch: int = 8, seq: int = 1024):
    d, ff, tok, vocab = 768, 3072, batch * seq, 50257
    # wte is tied to the output projection: its gradient is complete only after the
    # embedding backward, at the very end; the projection's compute comes first
    L = [("wte", vocab * d, "mem", float(tok * d)), ("wpe", 1024 * d, "mem", float(tok * d))]
    for i in range(12):
        p = f"h.{i}."
        L += [(p + "ln_1", 2 * d, "mem", float(tok * d)),
              _linear(p + "attn.c_attn", d, 3 * d, tok),
              (p + "attn.scores", 0, "free", 4.0 * seq * seq * d * batch),
              _linear(p + "attn.c_proj", d, d, tok),
              (p + "ln_2", 2 * d, "mem", float(tok * d)),
              _linear(p + "mlp.c_fc", d, ff, tok),
              _linear(p + "mlp.c_proj", ff, d, tok)]
    L += [("ln_f", 2 * d, "mem", float(tok * d)),
          ("lm_head(tied to wte)", 0, "free", 2.0 * d * vocab * tok)]
    return L


ARCHITECTURES = {
    "resnet50": (resnet50, "ResNet-50, batch 32 at 224x224"),
    "vgg16": (vgg16, "VGG-16, batch 32 at 224x224"),
    "bert_base": (bert_base, "BERT-base, batch 32 x 128 tokens"),
    "gpt2_small": (gpt2_small, "GPT-2 small, batch 8 x 1024 tokens"),
}
PUBLISHED_PARAMS = {"resnet50": 25_557_032, "vgg16": 138_357_544, "bert_base": 109_482_240,
                    "gpt2_small": 124_439_808}


def workload(name: str, dev: Device = Device()) -> Workload:
    """The model's backward pass: one tensor per parameterized layer, backward order."""
    if name not in ARCHITECTURES:
        from ..errors import ArgumentError
        raise ArgumentError(f"model: expected one of {', '.join(ARCHITECTURES)}, got {name!r}")
    layers = ARCHITECTURES[name][0]()
    names, nbytes, compute = [], [], []
    carry = 0.0
    for lname, params, kind, work in reversed(layers):
        if kind == "mm":
            t = 2.0 * work / dev.flops
        elif kind == "mem":
            t = NORM_PASSES * work * BYTES_PER_PARAM / dev.mem_bw
        else:
            carry += 2.0 * work / dev.flops
            continue
        names.append(lname)
        nbytes.append(params * BYTES_PER_PARAM)
        compute.append(max(dev.kernel_floor, t) + carry)
        carry = 0.0
    if carry and compute:
        compute[-1] += carry
    return Workload.of(nbytes, compute, names)


def params(name: str) -> int:
    return sum(p for _, p, _, _ in ARCHITECTURES[name][0]())
