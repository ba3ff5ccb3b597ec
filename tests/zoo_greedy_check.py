"""Greedy-decode a zoo model with vLLM in-process and print the token ids as JSON.

    python tests/zoo_greedy_check.py MODEL_DIR N_TOKENS

Two fixed prompts of different lengths are submitted as one batch (the long one is past 40 tokens, so a
sliding window of 16 is exceeded). fp32, temperature 0, ``ignore_eos=True``, ``max_tokens=N_TOKENS``.
The LAST line of stdout is ``{"prompt_token_ids": [[...], [...]], "generated": [[...], [...]],
"generated_logprobs": [[...], [...]]}``; tests compare it
against HF Transformers run on the very same prompt token ids. One engine per process (vLLM's CPU build does not
start a second one cleanly), so this runs in a subprocess of the test.
"""

from __future__ import annotations

import json
import os
import sys

PROMPTS = [
    "The capital of France is",
    # Long: well over 40 tokens with the zoo's tiny BPE, so sliding-window layers see tokens fall out of the window.
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories. "
    "Sliding window attention only sees the most recent tokens, while global attention sees them all. "
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in many prompts, as do questions and answers. "
    "The quick brown fox jumps over the lazy dog, and then",
]
MIN_LONG_PROMPT_TOKENS = 40


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(f"usage: {argv[0]} MODEL_DIR N_TOKENS", file=sys.stderr)
        return 2
    model_dir, n_tokens = argv[1], int(argv[2])

    # In-process engine (no engine-core subprocess), tiny KV cache: before vllm is imported.
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    prompt_ids = [tokenizer(p)["input_ids"] for p in PROMPTS]
    if len(prompt_ids[1]) < MIN_LONG_PROMPT_TOKENS:
        print(f"long prompt has only {len(prompt_ids[1])} tokens (< {MIN_LONG_PROMPT_TOKENS})", file=sys.stderr)
        return 3

    llm = LLM(model=model_dir, dtype="float32", enforce_eager=True, compilation_config={"mode": 0},
              enable_prefix_caching=False, max_model_len=512, seed=0)
    params = SamplingParams(temperature=0.0, max_tokens=n_tokens, ignore_eos=True, logprobs=1)
    outputs = llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], params, use_tqdm=False)

    result = {
        "prompt_token_ids": [list(o.prompt_token_ids) for o in outputs],
        "generated": [list(o.outputs[0].token_ids) for o in outputs],
        # log-probability vLLM gave each token it generated (full-vocabulary log-softmax of the final logits)
        "generated_logprobs": [[step[t].logprob for t, step in zip(o.outputs[0].token_ids, o.outputs[0].logprobs)]
                               for o in outputs],
    }
    sys.stdout.flush()
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
