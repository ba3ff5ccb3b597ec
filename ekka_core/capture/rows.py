"""The rows a model processed, learnt from the layout of each forward step: which token each request fed at each
position. Engines lay rows out themselves; this ledger is how a trace proves its layout (SGLang: against the tokens
the driver sent) or learns it (a vLLM Ekka does not drive, e.g. ``vllm serve``: who asked for which tokens)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class RowLedger:
    # request → position → the token id fed there (None: fed as an embedding); requests in order of arrival
    tokens: dict[str, dict[int, int | None]] = field(default_factory=dict)
    repeats: dict[tuple[str, int], int] = field(default_factory=dict)   # positions computed more than once
    problems: list[str] = field(default_factory=list)                    # layouts that could not be read
    cached: list[int] = field(default_factory=list)      # per sequence (after sequences()): prefix-cache hit length

    def see(self, reqs: list[Any], pos: list[int], input_ids: Any, problem: str | None = None) -> None:
        """One forward step: request id and position per row (None: padding), the ``input_ids`` tensor fed."""
        if problem and problem not in self.problems:
            self.problems.append(problem)
        ids = input_ids.tolist() if input_ids is not None else [None] * len(pos)
        for rid, p, tok in zip(reqs, pos, ids):
            if rid is None:
                continue
            fed = self.tokens.setdefault(rid, {})
            if p in fed:
                self.repeats[(rid, p)] = self.repeats.get((rid, p), 1) + 1
            fed[p] = tok

    def sequences(self, prompt_len: dict[str, int], prompts: dict[str, list[int]] | None = None
                  ) -> tuple[dict[str, int], list[list[int]], list[int], str | None]:
        """What the rows say each request ran: (sequence of each request, in order of arrival; its token ids;
        its prompt length, from ``prompt_len`` or all of them; what is missing). A request whose first computed
        position is past 0 had a prefix-cache hit: its first tokens come from ``prompts`` (the engine's request
        state) and are recorded in :attr:`cached`; any other gap is a problem."""
        seq_by_req, token_ids, prompt_lens, problems = {}, [], [], []
        self.cached = []
        for rid, fed in self.tokens.items():
            n = max(fed) + 1
            first = min(fed)
            prompt = (prompts or {}).get(rid)
            if first > 0 and prompt is not None and first <= len(prompt):
                fed = {**{p: prompt[p] for p in range(first)}, **fed}     # served from the prefix cache
                self.cached.append(first)
            else:
                self.cached.append(0)
            gaps = [p for p in range(n) if p not in fed]
            if gaps:
                problems.append(f"request {rid}: positions {gaps[:4]} were never computed and their tokens are not "
                                "known; restart the engine with prefix caching off (--no-enable-prefix-caching)")
            elif any(fed[p] is None for p in range(n)):
                problems.append(f"request {rid}: the model was fed embeddings, not token ids")
            seq_by_req[rid] = len(token_ids)
            token_ids.append([t if (t := fed.get(p)) is not None else -1 for p in range(n)])
            prompt_lens.append(prompt_len.get(rid, n))
        return seq_by_req, token_ids, prompt_lens, "; ".join(problems) or None

    def proof(self, seq_by_rid: dict[str, int], token_ids: list[list[int]], *,
              cached: list[int] | None = None) -> list[str]:
        """What is wrong with the rows, given what a driver fed each sequence: every (sequence, position) computed
        exactly once, with the token the driver sent or generated there — except the first ``cached[s]`` positions
        of sequence s, which a prefix-cache hit served (computed for an earlier request, not for this one)."""
        problems = list(self.problems)
        unknown = sorted(rid for rid in self.tokens if rid not in seq_by_rid)
        if unknown:
            problems.append(f"rows of requests Ekka did not send: {unknown[:4]}")
        if self.repeats:
            (rid, p), n = next(iter(self.repeats.items()))
            problems.append(f"{len(self.repeats)} positions were computed more than once (request {rid} position {p}: "
                            f"{n}×): the scheduler retracted and recomputed requests — give the engine more KV-cache "
                            "memory (engine_args.mem_fraction_static) or fewer/shorter prompts")
        for rid, s in seq_by_rid.items():
            expected = token_ids[s]
            seen = self.tokens.get(rid, {})
            first = cached[s] if cached and s < len(cached) else 0
            missing = [p for p in range(first, len(expected)) if p not in seen]
            if missing:
                problems.append(f"sequence {s}: positions {missing[:6]} were never traced (cached or replayed "
                                "without hooks: radix cache or CUDA graphs on?)")
            wrong = [p for p, t in sorted(seen.items()) if t is not None and (p >= len(expected) or t != expected[p])]
            if wrong:
                p = wrong[0]
                want = expected[p] if p < len(expected) else "nothing"
                problems.append(f"sequence {s}: the rows laid out at positions {wrong[:6]} were fed other tokens than "
                                f"the driver's (position {p}: token {seen[p]}, expected {want}): rows assigned to the "
                                "wrong request or position")
        return problems
