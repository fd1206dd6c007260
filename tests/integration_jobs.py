"""Tiny training jobs for tests/test_integrations.py: a Llama built from a config (no downloads),
random token data, a few optimizer steps in each framework with its scalebook integration.

Imported by the tests (success runs, in process) and run as a script for jobs that die:

    python tests/integration_jobs.py FRAMEWORK RUN_KEY --fail oom|sigterm|hang [--marker PATH]

``--fail oom`` raises ``torch.OutOfMemoryError`` from the 4th training forward (an exception in a
step); ``--fail sigterm`` writes MARKER at the 4th training forward and then blocks in that step
until the test's SIGTERM arrives (for Lightning, until Lightning has seen it); ``--fail hang`` writes
MARKER there and hangs (for up to 120 s: the test SIGKILLs it, a job that hung or was killed outright).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ingest import Client

# The model every job trains; tests assert these numbers.
LAYERS, HIDDEN, HEADS, KV_HEADS, FFN, VOCAB = 2, 32, 4, 2, 64, 128
MBS, GAS, SEQ, STEPS = 2, 2, 16, 6


def llama_params() -> int:
    """Parameters of the Llama below, by hand: embeddings and untied LM head (V·h each); per layer
    q and o projections (h·h each), k and v (h·kv·head_dim each), gated MLP (3·h·ffn), two RMSNorm
    weights (h each); final RMSNorm (h)."""
    head_dim = HIDDEN // HEADS
    per_layer = 2 * HIDDEN * HIDDEN + 2 * HIDDEN * KV_HEADS * head_dim + 3 * HIDDEN * FFN + 2 * HIDDEN
    return 2 * VOCAB * HIDDEN + LAYERS * per_layer + HIDDEN


def tiny_llama():
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=FFN, num_hidden_layers=LAYERS,
                         num_attention_heads=HEADS, num_key_value_heads=KV_HEADS, vocab_size=VOCAB,
                         max_position_embeddings=4 * SEQ)
    return LlamaForCausalLM(config)


def token_data(n: int = 64) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n, SEQ), generator=torch.Generator().manual_seed(1))


def fault_hook(fail: str | None, marker: Path | None, stop: Callable[[], bool] = lambda: False):
    """A forward hook that acts on the 4th training forward (module doc); None when no fault."""
    if fail is None:
        return None
    calls = {"n": 0}

    def hook(module: Any, args: Any, output: Any) -> None:
        if not module.training:
            return
        calls["n"] += 1
        if calls["n"] != 4:
            return
        if fail == "oom":
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total)")
        assert marker is not None
        marker.write_text("in step")
        deadline = time.monotonic() + 120
        while not stop() and time.monotonic() < deadline:
            time.sleep(0.05)

    return hook


def run_hf(run_fields: dict, fail: str | None = None, marker: Path | None = None):
    """transformers.Trainer with ScalebookCallback; returns the callback."""
    from transformers import Trainer, TrainingArguments

    from ingest.integrations import ScalebookCallback

    model = tiny_llama()
    data = token_data()

    class Tokens(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return len(data)

        def __getitem__(self, i: int) -> dict:
            return {"input_ids": data[i], "labels": data[i]}

    hook = fault_hook(fail, marker)
    if hook is not None:
        model.register_forward_hook(hook)
    args = TrainingArguments(output_dir=tempfile.mkdtemp(prefix="scalebook-hf-"),
                             per_device_train_batch_size=MBS, gradient_accumulation_steps=GAS, max_steps=STEPS,
                             report_to="none", logging_strategy="no", save_strategy="no", use_cpu=True,
                             activation_checkpointing=True, disable_tqdm=True, dataloader_num_workers=0)
    callback = ScalebookCallback(run_fields, client=Client(deadline_s=10))
    Trainer(model=model, args=args, train_dataset=Tokens(), callbacks=[callback]).train()
    return callback


def run_lightning(run_fields: dict, fail: str | None = None, marker: Path | None = None):
    """lightning.pytorch Trainer (bf16-mixed, grad accumulation) with ScalebookLightningCallback."""
    import lightning.pytorch as pl

    from ingest.integrations import ScalebookLightningCallback

    class Module(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.model = tiny_llama()

        def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
            return self.model(input_ids=batch, labels=batch).loss

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-3)

    module = Module()
    callback = ScalebookLightningCallback(run_fields, client=Client(deadline_s=10))
    trainer = pl.Trainer(accelerator="cpu", devices=1, max_steps=STEPS, accumulate_grad_batches=GAS,
                         precision="bf16-mixed", logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[callback])
    hook = fault_hook(fail, marker, stop=lambda: trainer.received_sigterm)
    if hook is not None:
        module.model.register_forward_hook(hook)
    trainer.fit(module, torch.utils.data.DataLoader(token_data(), batch_size=MBS))
    return callback


def run_accelerate(run_fields: dict, fail: str | None = None, marker: Path | None = None):
    """A plain loop under accelerate.Accelerator(log_with=[ScalebookTracker(model=...)])."""
    from accelerate import Accelerator

    from ingest.integrations import ScalebookTracker

    model = tiny_llama()
    hook = fault_hook(fail, marker)
    if hook is not None:
        model.register_forward_hook(hook)
    tracker = ScalebookTracker(run_fields, model=model, client=Client(deadline_s=10))
    accelerator = Accelerator(cpu=True, log_with=[tracker], gradient_accumulation_steps=GAS)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loader = torch.utils.data.DataLoader(token_data(), batch_size=MBS)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    accelerator.init_trackers("scalebook-test", config={"learning_rate": 1e-3})
    step = 0
    for batch in loader:
        with accelerator.accumulate(model):
            loss = model(input_ids=batch, labels=batch).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            step += 1
            accelerator.log({"loss": loss.item()}, step=step)
            if step == STEPS:
                break
    accelerator.end_training()
    return tracker


JOBS = {"hf": run_hf, "lightning": run_lightning, "accelerate": run_accelerate}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=sorted(JOBS))
    p.add_argument("run_key")
    p.add_argument("--fail", choices=("oom", "sigterm", "hang"))
    p.add_argument("--marker", type=Path)
    a = p.parse_args()
    torch.set_num_threads(1)
    JOBS[a.framework]({"run_key": a.run_key, "name": f"{a.framework}-{a.fail}"}, a.fail, a.marker)


if __name__ == "__main__":
    main()
