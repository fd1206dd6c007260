"""Model shape: what the rules know about a model from its run record, standard library only.

- `model_size_class`: the heatmap row of a model (billions, 2 significant figures);
- `flops_per_token`: training FLOPs per token (PaLM, Chowdhery et al. 2022, arXiv 2204.02311, app. B);
- `active_params`, `is_moe`: mixture-of-experts runs (the 6N rule counts the active parameters);
- `ModelShape`: a Llama-style decoder's dims, with THE parameter count from dims
  (`ModelShape.total_params`) used by the server's derived fields and the memory and throughput models;
- `resolve_shape`: the dims of a run record, the missing ones inferred from model_params (and said);
- `params_from_dims`: the parameter count of a record that gives dims and no model_params;
- `stage_split`: decoder layers per pipeline stage and the lm_head's stage (nanotron's cost-balanced
  walk, or Megatron's uniform split).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from core.record import flag_field, positive_int_field

Run = Mapping[str, Any]

#: vocabulary assumed when a record does not give one: the Llama-3 tokenizer's
DEFAULT_VOCAB = 128256
#: models up to this many parameters are assumed to tie their embeddings when the record does not
#: say (Llama-3.2 1B/3B, SmolLM, Qwen2.5 ≤ 3B tie; larger models do not)
TIED_UP_TO = 4e9


def model_size_class(model_params: int | None) -> float | None:
    """Billions of parameters rounded to 2 significant figures (1.34e9 → 1.3, 3.57e9 → 3.6,
    8.86e9 → 8.9, 469e9 → 470), so runs of one model whose reported counts differ slightly share a
    heatmap row; None for None or a non-positive count."""
    if not model_params or model_params <= 0:
        return None
    billions = model_params / 1e9
    digits = 1 - int(math.floor(math.log10(billions)))
    return round(billions, digits)


def flops_per_token(n_params: float, num_layers: int | None, hidden_size: int | None,
                    seq_len: int | None, *, recompute_full: bool = False) -> tuple[float, str]:
    """Training FLOPs per token and the method's name.

    PaLM appendix B: 6·N + 12·L·h·s (forward + backward, attention included). With full recompute
    the hardware executes one more forward: 8·N + 16·L·h·s. Without L, h or s: 6·N (8·N), "6N".
    """
    dense = (8.0 if recompute_full else 6.0) * n_params
    if num_layers is None or hidden_size is None or seq_len is None:
        return dense, "6N"
    # a dim of 0 makes the attention term 0 (6N); elementwise when the arguments are arrays of many
    # configurations (service/analytics/throughput_terms.terms_table)
    attn = (16.0 if recompute_full else 12.0) * num_layers * hidden_size * seq_len
    return dense + attn, "6N" if isinstance(attn, float) and not attn else "6N+12Lhs"


_ACTIVE = re.compile(r"(?:^|[-_ .])a(\d+(?:\.\d+)?)b(?:$|[-_ .)])", re.IGNORECASE)


def active_params(model_name: str | None, extra: Mapping[str, Any]) -> int | None:
    """Parameters active per token of a mixture-of-experts model: extra["active_params"], else the
    "A3B" token of names like "Qwen3-30B-A3B" (3e9). None for dense models or when unknown."""
    value = extra.get("active_params")
    if isinstance(value, (int, float)) and value > 0:
        return int(value)
    if model_name:
        m = _ACTIVE.search(model_name)
        if m:
            return int(float(m.group(1)) * 1e9)
    return None


def is_moe(row: Mapping[str, Any], extra: Mapping[str, Any] | None) -> bool:
    """A mixture-of-experts run: expert parallelism > 1, experts declared in extra (``num_experts``,
    ``moe``), or active parameters known (extra.active_params or an "A3B" name token:
    :func:`active_params`). THE rule: the server stores it as the run's ``is_moe`` column
    (service/derive.py), which keeps MoE and dense models of one size apart in the heatmap.

    ``row``: a run record (``ep``, ``model_name`` read); ``extra``: its extra dict (None = empty)."""
    extra = extra or {}
    ep = row.get("ep")
    if isinstance(ep, (int, float)) and ep > 1:
        return True
    if extra.get("num_experts") or extra.get("moe"):
        return True
    return active_params(row.get("model_name"), extra) is not None


@dataclass
class ModelShape:
    """A decoder-only transformer: hidden size h, layers, attention heads and KV heads, FFN width,
    vocabulary, whether the lm_head shares the embedding's weights (tied), and whether the MLP is
    gated (SwiGLU/GeGLU, three matrices, as Llama's) or plain (GPT's GELU, two)."""

    h: int
    layers: int
    heads: int
    kv: int
    ffn: int
    vocab: int
    tied: bool
    gated: bool = True

    @property
    def head_dim(self) -> int:
        return self.h // self.heads

    @property
    def mlp_matrices(self) -> int:
        """3 for a gated MLP (gate, up, down: Shazeer 2020, "GLU Variants Improve Transformer", arXiv
        2002.05202), 2 for a plain one (up, down: GPT-2, Radford et al. 2019); Megatron-Core's
        `gated_linear_unit`."""
        return 3 if self.gated else 2

    def layer_params(self) -> int:
        """One block: q,o (h·h each), k,v (h·kv·d each), the MLP (mlp_matrices·h·ffn), 2 norms."""
        qd, kvd = self.heads * self.head_dim, self.kv * self.head_dim
        return 2 * self.h * qd + 2 * self.h * kvd + self.mlp_matrices * self.h * self.ffn + 2 * self.h

    def total_params(self) -> int:
        """THE parameter count from dims: L blocks + embedding (and an untied lm_head) + the final norm."""
        emb = self.vocab * self.h * (1 if self.tied else 2)
        return self.layers * self.layer_params() + emb + self.h


def assume(value: Any, default: Any, notes: list[str], note: str) -> Any:
    """`value`, or `default` with `note` appended to `notes` (an assumption the answer states) when
    value is None."""
    if value is None:
        notes.append(note)
        return default
    return value


def resolve_shape(run: Run, notes: list[str]) -> ModelShape:
    """The model dims of a run record (hidden_size, num_layers, num_heads, num_kv_heads,
    ffn_hidden_size, vocab_size, gated_linear_unit, model_params; extra.tie_word_embeddings), each
    missing one assumed or inferred from model_params and said in `notes`: vocab 128,256 (Llama-3);
    tied embeddings up to 4B parameters; a gated MLP (Llama's SwiGLU); h from L (or L from h) by
    N ≈ 12·L·h² + V·h (Ultra-Scale Playbook: ~12h² per block), both by the Llama aspect ratio
    h ≈ 128·L; head_dim 128; no GQA; the FFN width solved from model_params (rounded to 256), else
    SwiGLU's 8h/3 rounded up to 256 (GPT's 4h for a plain MLP).

    Raises ValueError naming the field when a value is not a positive number, or when model_params
    is needed (hidden_size or num_layers missing) and absent."""
    n = positive_int_field(run, "model_params")
    h, layers = positive_int_field(run, "hidden_size"), positive_int_field(run, "num_layers")
    vocab = assume(positive_int_field(run, "vocab_size"), DEFAULT_VOCAB, notes,
                     f"vocab_size={DEFAULT_VOCAB} (Llama-3 tokenizer)")
    tied = flag_field(run, "tie_word_embeddings")
    if tied is None:
        tied = n is not None and n <= TIED_UP_TO
        notes.append(f"tie_word_embeddings={tied} (not reported; small models usually tie)")
    if h is None or layers is None:
        h, layers = _infer_width_depth(n, h, layers, vocab * (1 if tied else 2), notes)
    heads = assume(positive_int_field(run, "num_heads"), max(1, h // 128), notes, "num_heads=h/128 (head_dim 128)")
    kv = assume(positive_int_field(run, "num_kv_heads"), heads, notes, "num_kv_heads=num_heads (no GQA)")
    ffn = positive_int_field(run, "ffn_hidden_size")
    gated = assume(flag_field(run, "gated_linear_unit"), True, notes,
                   "gated_linear_unit=true (not reported: a gated MLP of three matrices, as Llama's SwiGLU)")
    shape = ModelShape(h, layers, heads, kv, 0, vocab, tied, gated)
    if ffn is None:
        if n is not None:  # solve N = L·(attn + k·h·ffn + 2h) + emb + h for ffn (k MLP matrices), round to 256
            rest = (n - shape.total_params()) / layers
            ffn = max(256, int(round(rest / (shape.mlp_matrices * h) / 256)) * 256)
            notes.append(f"ffn_hidden_size={ffn} inferred from model_params")
        elif gated:
            ffn = int(math.ceil(8 * h / 3 / 256)) * 256
            notes.append(f"ffn_hidden_size={ffn} (SwiGLU 8h/3)")
        else:
            ffn = 4 * h
            notes.append(f"ffn_hidden_size={ffn} (GPT's 4h)")
    shape.ffn = ffn
    if n is not None and abs(shape.total_params() - n) > 0.05 * n:
        notes.append(f"dims give {shape.total_params():,} params vs model_params {n:,}; dims used")
    return shape


#: inferred widths are multiples of this: 8 heads of head_dim 128 — every Llama-3, Qwen2.5 and Mistral width
#: is (2048, 3072, 4096, 5120, 8192, 16384), so an inferred model can be split over TP up to 8 as real ones
HIDDEN_QUANTUM = 1024


def _infer_width_depth(n: int | None, h: int | None, layers: int | None, emb: int,
                       notes: list[str]) -> tuple[int, int]:
    """(h, layers) when one or both are missing, from model_params n and emb = embedding rows per h
    (V, or 2V untied) by N ≈ 12·L·h² + emb·h; raises ValueError when n is missing too."""
    if n is None:
        missing = "hidden_size" if h is None else "num_layers"
        raise ValueError(f"model_params: required when {missing} is missing (cannot size the model)")
    if h is None and layers is not None:   # N ≈ 12·L·h² + emb·h  [UP]: ~12h² params per block
        a, b = 12 * layers, emb
        h = int(round((-b + math.sqrt(b * b + 4 * a * n)) / (2 * a) / 128)) * 128 or 128
        notes.append(f"hidden_size={h} inferred from model_params and num_layers (12·L·h² + V·h)")
    elif h is not None:
        layers = max(1, round((n - emb * h) / (12 * h * h)))
        notes.append(f"num_layers={layers} inferred from model_params and hidden_size (12·L·h² + V·h)")
    else:  # Llama-family aspect ratio h ≈ 128·L (1B: 2048/16, 8B: 4096/32, 405B: 16384/126), h a multiple of
        # HIDDEN_QUANTUM (released models' widths are: 8 heads of 128, so TP up to 8 splits them), then the
        # depth that gives N at that width
        depth = max(1, round((n / (12 * 128 * 128)) ** (1 / 3)))
        h = max(HIDDEN_QUANTUM, round(128 * depth / HIDDEN_QUANTUM) * HIDDEN_QUANTUM)
        layers = max(1, round((n - emb * h) / (12 * h * h)))
        notes.append(f"num_layers={layers}, hidden_size={h} inferred from model_params (h ≈ 128·L, a multiple of "
                     f"{HIDDEN_QUANTUM})")
    assert h is not None and layers is not None
    return h, layers


def params_from_dims(rec: Run) -> int | None:
    """The parameter count of a record that gives its dims and no model_params:
    `ModelShape.total_params` of `resolve_shape` (heads, KV heads, FFN width and tied embeddings
    assumed as it says; untied when not reported). None unless num_layers, hidden_size and
    vocab_size are known and positive."""
    if not (rec.get("num_layers") and rec.get("hidden_size") and rec.get("vocab_size")):
        return None
    try:
        return resolve_shape({k: v for k, v in rec.items() if k != "model_params"}, []).total_params()
    except ValueError:
        return None


def stage_split(shape: ModelShape, pp: int, balanced: bool) -> tuple[list[int], int]:
    """(decoder layers per pipeline stage, the 0-based stage that holds the lm_head).

    balanced (nanotron's build_model): blocks are walked in order, the lm_head counts V·h against a
    layer's 4·a·d·h + k·ffn·h (k MLP matrices), and a stage is closed once the cumulative cost reaches its share
    cost·(r+1)/pp — which reproduces the sweep's "Local Params" (10/5/3 first-stage layers for pp
    2/4/8 on the 1.34B model). The lm_head lands on the stage the walk has reached after the last
    decoder layer — not the last one when the split leaves trailing stages without layers (1.34B
    over 8 stages splits its 16 layers 3/2/3/2/3/2/1/0 and the head is on stage 6). Otherwise
    Megatron-style uniform split, the head on the last stage.
    """
    if pp == 1:
        return [shape.layers], 0
    if not balanced:
        base, extra_layers = divmod(shape.layers, pp)
        return [base + (1 if r < extra_layers else 0) for r in range(pp)], pp - 1
    c = 4 * shape.heads * shape.head_dim * shape.h + shape.mlp_matrices * shape.ffn * shape.h
    total = shape.layers * c + shape.vocab * shape.h
    counts, rank, cum = [0] * pp, 0, 0
    for _ in range(shape.layers):
        cum += c
        counts[rank] += 1
        if rank < pp - 1 and cum >= total * (rank + 1) / pp:
            rank += 1
    return counts, rank


@dataclass(frozen=True)
class KnownModel:
    """A published model's architecture, from its released configuration (`source`): what a run that
    names the model but not its dims ran (core/model.known_model)."""

    name: str
    params: int
    layers: int
    h: int
    heads: int
    kv: int
    ffn: int
    vocab: int
    gated: bool
    tied: bool
    source: str


_LLAMA3 = "config.json of meta-llama/{} on the Hugging Face Hub"
_MPT = ("llm-foundry scripts/train/yamls/pretrain/{}.yaml (d_model, n_heads, n_layers, expansion_ratio 4, "
        "vocab 50368; GELU MLP, tied embeddings), the configurations of its published benchmark table")
#: published models by normalised name (known_model): only architectures read off their released
#: configuration files, each with its source
KNOWN_MODELS: dict[str, KnownModel] = {m.name: m for m in (
    KnownModel("llama38b", 8_030_261_248, 32, 4096, 32, 8, 14336, 128256, True, False,
               _LLAMA3.format("Meta-Llama-3-8B")),
    KnownModel("llama318b", 8_030_261_248, 32, 4096, 32, 8, 14336, 128256, True, False,
               _LLAMA3.format("Llama-3.1-8B")),
    KnownModel("llama370b", 70_553_706_496, 80, 8192, 64, 8, 28672, 128256, True, False,
               _LLAMA3.format("Meta-Llama-3-70B")),
    KnownModel("llama3170b", 70_553_706_496, 80, 8192, 64, 8, 28672, 128256, True, False,
               _LLAMA3.format("Llama-3.1-70B")),
    KnownModel("llama31405b", 405_853_388_800, 126, 16384, 128, 8, 53248, 128256, True, False,
               _LLAMA3.format("Llama-3.1-405B")),
    KnownModel("llama27b", 6_738_415_616, 32, 4096, 32, 32, 11008, 32000, True, False,
               _LLAMA3.format("Llama-2-7b-hf")),
    KnownModel("llama213b", 13_015_864_320, 40, 5120, 40, 40, 13824, 32000, True, False,
               _LLAMA3.format("Llama-2-13b-hf")),
    KnownModel("llama270b", 68_976_648_192, 80, 8192, 64, 8, 28672, 32000, True, False,
               _LLAMA3.format("Llama-2-70b-hf")),
    KnownModel("gpt3175b", 174_600_000_000, 96, 12288, 96, 96, 49152, 50257, False, True,
               "Brown et al. 2020, arXiv 2005.14165, Table 2.1 (96 layers, d_model 12,288, 96 heads, ffn 4·d_model)"),
    KnownModel("mpt125m", 125_311_488, 12, 768, 12, 12, 3072, 50368, False, True, _MPT.format("mpt-125m")),
    KnownModel("mpt350m", 355_985_408, 24, 1024, 16, 16, 4096, 50368, False, True, _MPT.format("mpt-350m")),
    KnownModel("mpt760m", 760_470_528, 24, 1536, 12, 12, 6144, 50368, False, True, _MPT.format("mpt-760m")),
    KnownModel("mpt1b", 1_315_950_592, 24, 2048, 16, 16, 8192, 50368, False, True, _MPT.format("mpt-1b")),
    KnownModel("mpt3b", 2_651_837_440, 32, 2560, 20, 20, 10240, 50368, False, True, _MPT.format("mpt-3b")),
    KnownModel("mpt7b", 6_658_859_008, 32, 4096, 32, 32, 16384, 50368, False, True, _MPT.format("mpt-7b")),
    KnownModel("mpt13b", 12_853_954_560, 40, 5120, 40, 40, 20480, 50368, False, True, _MPT.format("mpt-13b")),
    KnownModel("mpt30b", 29_975_214_080, 48, 7168, 64, 64, 28672, 50368, False, True, _MPT.format("mpt-30b")),
    KnownModel("mpt70b", 64_862_437_376, 80, 8192, 64, 64, 32768, 50368, False, True, _MPT.format("mpt-70b")),
)}
#: a record's model_params must be within this of the known model's count for its dims to be taken
KNOWN_PARAMS_TOLERANCE = 0.05


def known_model(model_name: str | None, model_params: int | None = None) -> KnownModel | None:
    """The published model a run names ("LLAMA3_70B", "Llama 3.1 405B", "MPT-7b": lower case, letters
    and digits only, matched whole), None when the name is not one of KNOWN_MODELS or the record's
    model_params differs from the model's by more than KNOWN_PARAMS_TOLERANCE (another model of the
    same name). A run's dims are taken from it only when it states none (service/derive.py)."""
    if not model_name:
        return None
    found = KNOWN_MODELS.get(re.sub(r"[^a-z0-9]", "", model_name.lower()))
    if found is None:
        return None
    if model_params and abs(model_params - found.params) > KNOWN_PARAMS_TOLERANCE * found.params:
        return None
    return found


#: Whether a published architecture's MLP is gated (three matrices: gate, up, down -- SwiGLU/GeGLU) or
#: plain (two), by the Hugging Face class name a config lists in ``architectures`` and by its
#: ``model_type``; read off the transformers modeling files (LlamaMLP, MistralMLP, Qwen2MLP, Qwen3MLP,
#: GemmaMLP, Phi3MLP, OlmoMLP, Olmo2MLP, MixtralBlockSparseTop2MLP, DeepseekV3MLP have ``gate_proj`` or
#: a fused ``gate_up_proj``; GPT2MLP, GPTNeoXMLP, OPT's fc1/fc2, BloomMLP, GPTJMLP, FalconMLP, PhiMLP,
#: Starcoder2MLP and llm-foundry's MPT ``mptmlp`` have one up- and one down-projection). Log readers
#: set ``gated_linear_unit`` from it only where a log names the architecture.
GATED_MLP_ARCHITECTURES: dict[str, bool] = {
    **dict.fromkeys(("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM",
                     "GemmaForCausalLM", "Gemma2ForCausalLM", "Phi3ForCausalLM", "OlmoForCausalLM",
                     "Olmo2ForCausalLM", "MixtralForCausalLM", "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
                     "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "phi3", "olmo", "olmo2", "mixtral",
                     "deepseek_v2", "deepseek_v3"), True),
    **dict.fromkeys(("GPT2LMHeadModel", "GPTNeoXForCausalLM", "OPTForCausalLM", "BloomForCausalLM",
                     "GPTJForCausalLM", "FalconForCausalLM", "PhiForCausalLM", "Starcoder2ForCausalLM",
                     "MPTForCausalLM", "gpt2", "gpt_neox", "opt", "bloom", "gptj", "falcon", "phi", "starcoder2",
                     "mpt"), False),
}
