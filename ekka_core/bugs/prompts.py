"""The prompts, chat messages and long texts the bug cases send."""

from __future__ import annotations

DEFAULT_PROMPTS = [
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories. "
    "The capital of France is Paris.",
    "Sliding window attention only sees the most recent tokens",
]


# Texts of the bug cases. The zoo tokenizer is trained on sentences like these, so they tokenize compactly
# (token counts with the zoo tokenizer in the comments).
_SENTENCES = [
    "The quick brown fox jumps over the lazy dog. A serving engine answers a prompt token by token.",
    "Silent errors do not crash: the model still answers, but worse. Attention looks back over the context window.",
    "Sliding window attention only sees the most recent tokens, while global attention sees them all.",
    "Numbers like 0 1 2 3 4 5 6 7 8 9 10 100 1000 appear in many prompts, as do questions and answers.",
    "Once upon a time there was a small model that learned to count, to rhyme and to tell long stories.",
    "The capital of France is Paris. The capital of Italy is Rome. Water boils at one hundred degrees.",
    "def add(a, b): return a + b  # code is text too, with brackets, colons and comments.",
]
CHAT_MESSAGES = [{"role": "system", "content": "You are a helpful assistant."},
                 {"role": "user", "content": "What is the capital of France?"}]
SHARED_PREFIX = " ".join(_SENTENCES[:6])                       # 157 tokens: one full 128-token KV block
CHUNKED_PROMPT = " ".join(_SENTENCES) + " Question: which numbers appear in many prompts?"        # 210 tokens
_LONG_ORDER = [3, 0, 5, 2, 6, 1, 4, 1, 6, 0, 4, 2, 5, 3, 5, 4, 3, 6, 0, 2, 1, 2, 3, 1, 0, 5, 6, 4]
LONG_PROMPT = " ".join(_SENTENCES[i] for i in _LONG_ORDER) + " Question: what is the capital of Italy?"  # ~770
