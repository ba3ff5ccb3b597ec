"""A vLLM-CPU engine in its served (compiled) configuration whose Inductor decomposes SiLU wrongly (quick-GELU's
sigmoid scale), with in-graph localisation on: ``python wrong_silu_engine.py MODEL OUTDIR``. A script of its own so
the patched decomposition table and the engine stay out of the test process (the engine runs in this process)."""

import os
import sys

import torch
import torch._inductor.decomposition as decomposition

model, out = sys.argv[1], sys.argv[2]
os.environ["EKKA_GRAPH_DIR"] = out
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
from ekka_core.capture.vllm_config import CPU_KVCACHE_GIB  # noqa: E402

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KVCACHE_GIB))   # as Ekka's runner: other tests run beside
decomposition.decompositions[torch.ops.aten.silu.default] = lambda x: x * torch.sigmoid(1.702 * x)

from vllm import LLM, SamplingParams  # noqa: E402  (after the environment it reads)

llm = LLM(model, dtype="bfloat16", max_model_len=256, max_num_seqs=1)
llm.generate([{"prompt_token_ids": list(range(1, 40))}], SamplingParams(max_tokens=2, temperature=0))
