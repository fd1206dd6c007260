"""Train a tiny decoder-only transformer for a few steps and record the run with scalebook.

    torchrun --nproc-per-node 2 examples/train_tiny.py --tp 1 --micro-batch-size 4 --grad-accum 2
    python examples/train_tiny.py --steps 8                      # one process, no torchrun

Data parallel (DDP; gloo on CPU, NCCL on GPUs), byte vocabulary (256), random token batches
(seeded). Activation recompute is real: ``--recompute full`` checkpoints every block,
``selective`` only the attention core (``torch.utils.checkpoint``). Only ``--tp 1`` is
implemented: the flag exists so sweeps record the layout they ran.

``--memory-budget-mib`` emulates a device memory limit on CPU (CPUs have no allocator cap): before
the first step the activation memory of the configuration is estimated with Korthikanti et al.
2022 (arXiv 2205.05198) -- ``s·b·h·(34 + 5·a·s/h)`` bytes per layer without recompute,
``s·b·h·34`` with selective, ``2·s·b·h`` with full recompute -- plus ``16·params`` bytes for the
mixed-precision weights, gradients and Adam states, and ``torch.OutOfMemoryError`` is raised when
the sum exceeds the budget, so a CPU sweep shows an OOM region like a GPU sweep would.

The run is pushed from rank 0 to SCALEBOOK_API_URL by :class:`ingest.Recorder` (spooled under
SCALEBOOK_SPOOL_DIR when the API is down). ``--result-json PATH`` makes rank 0 write the pushed
record and the push status there, even when training fails (the sweep reads it).
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from ingest import Client, Recorder  # noqa: E402

VOCAB = 256


class Block(nn.Module):
    """Pre-norm decoder block: causal multi-head attention + GELU MLP (4h). x: (batch, seq, hidden)."""

    def __init__(self, hidden: int, heads: int, recompute: str):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden size {hidden} is not divisible by {heads} heads")
        self.heads, self.recompute = heads, recompute
        self.ln1, self.ln2 = nn.LayerNorm(hidden), nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.mlp = nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(), nn.Linear(4 * hidden, hidden))

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).permute(2, 0, 3, 1, 4)
        if self.recompute == "selective" and self.training:
            att = checkpoint(self._attend, q, k, v, use_reentrant=False)
        else:
            att = self._attend(q, k, v)
        x = x + self.proj(att.transpose(1, 2).reshape(b, s, h))
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    """Token + position embeddings, `layers` blocks, final norm, untied LM head. ids: (batch, seq) → logits."""

    def __init__(self, layers: int, hidden: int, heads: int, seq_len: int, recompute: str):
        super().__init__()
        self.recompute = recompute
        self.tok = nn.Embedding(VOCAB, hidden)
        self.pos = nn.Embedding(seq_len, hidden)
        self.blocks = nn.ModuleList(Block(hidden, heads, recompute) for _ in range(layers))
        self.ln = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, VOCAB, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tok(ids) + self.pos(torch.arange(ids.shape[1], device=ids.device))
        for block in self.blocks:
            x = checkpoint(block, x, use_reentrant=False) if self.recompute == "full" and self.training else block(x)
        return self.head(self.ln(x))


def activation_bytes(args: argparse.Namespace, params: int) -> int:
    """Estimated peak bytes per rank (see the module doc): activations + 16 bytes per parameter."""
    s, b, h, a, L = args.seq_len, args.micro_batch_size, args.hidden, args.heads, args.layers
    per_layer = {"none": s * b * h * (34 + 5 * a * s / h), "selective": s * b * h * 34, "full": 2 * s * b * h}
    return int(L * per_layer[args.recompute] + 16 * params)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=8, help="optimizer steps (warm-up included)")
    p.add_argument("--warmup", type=int, default=2, help="untimed warm-up steps")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--micro-batch-size", type=int, default=4)
    p.add_argument("--grad-accum", type=int, default=1)
    p.add_argument("--recompute", choices=("none", "selective", "full"), default="none")
    p.add_argument("--tp", type=int, default=1, help="tensor parallel size (only 1 is implemented)")
    p.add_argument("--lr", type=float, default=3e-4)
    p.add_argument("--memory-budget-mib", type=float, default=None, help="emulated device memory limit")
    p.add_argument("--name", default=None, help="run name (default: derived from the config)")
    p.add_argument("--run-key", default=None, help="idempotency key of the run (default: uuid4)")
    p.add_argument("--result-json", default=None, help="rank 0 writes the record and push status here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.tp != 1:
        raise SystemExit("train_tiny.py implements data parallelism only: use --tp 1")
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank() if distributed else 0
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if torch.cuda.is_available()
              else torch.device("cpu"))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    torch.manual_seed(1234)
    model = TinyGPT(args.layers, args.hidden, args.heads, args.seq_len, args.recompute).to(device)
    params = sum(p.numel() for p in model.parameters())
    ddp = nn.parallel.DistributedDataParallel(model) if distributed else model
    opt = torch.optim.AdamW(ddp.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(1000 + rank)
    tokens_per_step = args.micro_batch_size * args.grad_accum * args.seq_len
    name = args.name or (f"tiny-{args.layers}L{args.hidden}h mbs{args.micro_batch_size} gas{args.grad_accum} "
                         f"rc-{args.recompute}")
    fields = {"run_key": args.run_key, "name": name, "model_name": f"tiny-gpt-{args.layers}L{args.hidden}h",
              "model_params": params, "num_layers": args.layers, "hidden_size": args.hidden,
              "num_heads": args.heads, "num_kv_heads": args.heads, "ffn_hidden_size": 4 * args.hidden,
              "vocab_size": VOCAB, "seq_len": args.seq_len, "tp": args.tp, "pp": 1, "cp": 1, "ep": 1,
              "zero_stage": 0, "micro_batch_size": args.micro_batch_size, "grad_accum_steps": args.grad_accum,
              "recompute": args.recompute, "precision": "fp32", "framework": "pytorch-ddp",
              "extra": {"example": "train_tiny", "device": device.type,
                        "memory_budget_mib": args.memory_budget_mib}}
    rec = Recorder(fields, client=Client(deadline_s=10.0), warmup_steps=args.warmup)
    loss = torch.tensor(float("nan"))
    try:
        with rec:
            if args.memory_budget_mib is not None:
                need = activation_bytes(args, params)
                if need > args.memory_budget_mib * 2**20:
                    raise torch.OutOfMemoryError(
                        f"CUDA out of memory. Tried to allocate {need / 2**20:.1f} MiB; emulated device budget "
                        f"{args.memory_budget_mib:.1f} MiB (train_tiny --memory-budget-mib)")
            for _ in range(args.steps):
                opt.zero_grad(set_to_none=True)
                for _ in range(args.grad_accum):
                    ids = torch.randint(0, VOCAB, (args.micro_batch_size, args.seq_len + 1), generator=gen).to(device)
                    logits = ddp(ids[:, :-1])
                    loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[:, 1:].reshape(-1)) / args.grad_accum
                    loss.backward()
                opt.step()
                rec.step(tokens=tokens_per_step, loss=loss.item() * args.grad_accum)  # also the live step series
    finally:
        if rank == 0 and args.result_json:
            Path(args.result_json).write_text(json.dumps({
                "record": rec.record, "push_status": rec.result.status if rec.result else None}, default=str))
        if distributed:
            # tear down in order: both ranks past their last collective (when no error is in flight:
            # a crashed peer would leave the barrier waiting), the DDP reducer released, then the
            # process group (gloo aborted one rank at exit, "terminate called without an active
            # exception", when the group went while the other rank's reducer still held it)
            if sys.exc_info()[0] is None:
                dist.barrier()
            # the reducer (and any gloo work it still holds) freed now, not at interpreter shutdown,
            # where a gloo worker thread dropping a tensor aborts the process (pytorch/pytorch#179291)
            del ddp, opt
            gc.collect()
            dist.destroy_process_group()
    if rank == 0:
        r = rec.record or {}
        print(f"{name}: {r.get('tokens_per_sec_per_gpu') or 0:.0f} tokens/s/GPU, "
              f"step {r.get('step_time_s') or 0:.3f} s, "
              f"loss {loss.item() * args.grad_accum:.3f} (ln 256 = {math.log(VOCAB):.3f}); "
              f"push: {rec.result.status if rec.result else 'off'} run_key {rec.run_key}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
