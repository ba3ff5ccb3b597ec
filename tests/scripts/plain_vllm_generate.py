"""A user's own vLLM script, unaware of Ekka (used by tests: traced only through EKKA_TRACE_DIR).

    python plain_vllm_generate.py MODEL [TENSOR_PARALLEL_SIZE]
"""
import json, sys
from vllm import LLM, SamplingParams
if __name__ == "__main__":
    tp = int(sys.argv[2]) if len(sys.argv) > 2 else 1
    llm = LLM(model=sys.argv[1], dtype="float32", enforce_eager=True, compilation_config={"mode": 0},
              enable_prefix_caching=False, max_model_len=256, seed=0, tensor_parallel_size=tp,
              **({"distributed_executor_backend": "mp"} if tp > 1 else {}))
    out = llm.generate(["Once upon a time there was", "The capital of France is"],
                       SamplingParams(temperature=0, max_tokens=4), use_tqdm=False)
    print("GEN", json.dumps([list(o.outputs[0].token_ids) for o in out]))
