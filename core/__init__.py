"""The domain rules of scalebook, each written once, standard library only (DESIGN §1).

- core.record: the run record's vocabulary (statuses, recompute modes, error classes, the reported
  and derived fields, aliases) and the one parameter-count parser;
- core.hardware: the hardware catalog (cited sources) and the one precision normaliser;
- core.rules: the config label, the effective MFU and the best-run key;
- core.families: the fixed grid of model-size families;
- core.layout: whether a parallel layout (TP, PP, CP) can run a model (heads, KV heads, layers, sequence);
- core.model: model shape — size class, FLOPs per token, MoE, the parameter count from dims, the
  pipeline stage split.

ingest/, service/ and dashboard/ import these; core imports nothing of theirs (tests/test_layers.py).
"""
