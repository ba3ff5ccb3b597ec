"""One agent session: knowledge base first, then the tool-use loop with the validator, then the mapping update."""

from __future__ import annotations

import copy
import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ekka_core.agent.api import (REASON_BUDGET, REASON_DISABLED, REASON_FAILED, REASON_GAVE_UP, REASON_NO_KEY,
                                 REASON_NO_SDK, AgentStop, Caller)
from ekka_core.agent.budget import Budget, BudgetExceeded, Usage, estimate_tokens
from ekka_core.agent.config import AgentConfig
from ekka_core.agent.kb import KBKey, KnowledgeBase, major_minor
from ekka_core.agent.proposals import Explanation, Proposal, Validator, Verdict, generalize, instantiate, match
from ekka_core.agent.tools import TOOLS, Toolbox, check_args
from ekka_core.agent.transcript import Transcript
from ekka_core.contracts.jsonable import to_json
from ekka_core.contracts.mapping import AGENT_EXPLAINED, AGENT_MAPPED, UNCHECKED
from ekka_core.contracts.report import AgentSection, AgentSessionCounts
from ekka_core.mapping import Mapping, Unmapped
from ekka_core.tree import ModelTree

OK_STATUSES = ("nothing-to-do", "knowledge-base", "complete")

SYSTEM = """\
You are the component-mapping agent of Ekka, which diagnoses silent numerical errors in LLM serving engines by \
comparing every component of the engine under test (the *target*, e.g. vLLM) with the trusted *reference* \
(e.g. HF Transformers) on the same tokens. Deterministic rules already mapped most components; you handle the \
ones they could not place.

For each component you are given, find the reference module(s) whose tensor is the same quantity, and call \
propose_mapping — or, when the reference has no counterpart, explain_unmapped with the reason. Names can \
mislead: read the classes (get_class_definition) and, when traces are available, check the numbers \
(get_tensor_sum, infer_tensor_match). Fused target modules are usually 1:N concatenations of reference modules \
(qkv_proj ↔ q_proj, k_proj, v_proj with GQA widths); a fused activation (act(gate) * up) corresponds to the input \
of the reference's down projection; the attention kernel's output is the input of o_proj. Use {i} in a path for \
the layer index to cover all layers at once. Never guess a mapping you have not checked: a wrong mapping produces \
a confident, wrong diagnosis; an honest explain_unmapped is better. Call finish when every component is proposed \
or explained; a validator checks everything and sends back what to fix."""


@dataclass
class AgentOutcome(AgentSessionCounts):
    status: str = "nothing-to-do"
    message: str = ""
    model: str = ""
    asked: list[str] = field(default_factory=list)              # components the rules left with "no rule"
    mapped: list[str] = field(default_factory=list)             # mapped by the agent in this run
    explained: list[str] = field(default_factory=list)          # declared unmapped (with a reason) by the agent
    from_kb: list[str] = field(default_factory=list)            # mapped or explained from the knowledge base
    unchecked: list[dict[str, str]] = field(default_factory=list)
    usage: Usage = field(default_factory=Usage)
    budget: dict[str, Any] = field(default_factory=dict)
    budget_exceeded: str | None = None                          # which limit stopped the session
    kb_key: dict[str, str] = field(default_factory=dict)
    kb_used: list[str] = field(default_factory=list)
    kb_written: list[str] = field(default_factory=list)
    aligners: dict[str, dict[str, Any]] = field(default_factory=dict)
    events: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    transcript: dict[str, str] | None = None                    # file names in the report directory

    @property
    def ok(self) -> bool:
        return self.status in OK_STATUSES

    @property
    def calls(self) -> int:
        return self.usage.calls

    @property
    def dollars(self) -> float:
        return self.usage.dollars

    def summary(self) -> str:
        u = self.usage
        if self.status == "nothing-to-do":
            return "agent: not needed (the rules mapped or explained every component)"
        cost = f"{u.calls} API call(s), {u.input_tokens} in / {u.output_tokens} out tokens, ${u.dollars:.4f}"
        if self.status == "knowledge-base":
            return f"agent: {len(self.from_kb)} component(s) from the knowledge base, no API call ($0)"
        if self.status == "complete":
            kb = f", {len(self.from_kb)} from the knowledge base" if self.from_kb else ""
            return f"agent: mapped {len(self.mapped)}, explained {len(self.explained)}{kb} — {cost}"
        return f"agent: {len(self.unchecked)} component(s) left unchecked — {self.message} ({cost})"

    def to_report(self) -> AgentSection:
        """The report's ``agent`` section."""
        return AgentSection(
            status=self.status, ok=self.ok, message=self.message, model=self.model,
            components={"asked": len(self.asked), "mapped": len(self.mapped), "explained": len(self.explained),
                        "from_knowledge_base": len(self.from_kb), "unchecked": len(self.unchecked)},
            mapped=list(self.mapped), explained=list(self.explained), from_knowledge_base=list(self.from_kb),
            unchecked=list(self.unchecked),
            usage=self.usage.rounded(), budget={**self.budget, "exceeded": self.budget_exceeded},
            **{f.name: copy.copy(getattr(self, f.name)) for f in dataclasses.fields(AgentSessionCounts)},
            knowledge_base={"key": self.kb_key, "used": self.kb_used, "written": self.kb_written},
            aligners={c: {k: v for k, v in a.items() if k != "source"} for c, a in self.aligners.items()},
            transcript=self.transcript, events=list(self.events), notes=list(self.notes))

    def to_json(self) -> dict[str, Any]:
        """The report's ``agent`` field as JSON (:meth:`to_report`, written by the report codec)."""
        return to_json(self.to_report())


def kb_key(target: ModelTree, reference: ModelTree, traces: Any, config: AgentConfig) -> KBKey:
    tv = getattr(getattr(getattr(traces, "target", None), "run", None), "framework_version", None)
    rv = getattr(getattr(getattr(traces, "reference", None), "run", None), "framework_version", None)
    root_t, root_r = target.modules.get(""), reference.modules.get("")
    return KBKey(target.framework, major_minor(tv or config.target_version), reference.framework,
                 major_minor(rv or config.reference_version), root_t.cls if root_t else "unknown",
                 root_r.cls if root_r else "unknown")


def complete_mapping(mapping: Mapping, target_tree: ModelTree, reference_tree: ModelTree, *, traces: Any = None,
                     config: AgentConfig | None = None, client: Any = None,
                     transcript_dir: Path | None = None) -> AgentOutcome:
    """Map what the rules left open (status ``no-rule`` / ``rules-off``) — from the knowledge base when it knows,
    else with the agent.

    Updates ``mapping`` (new pairs, with the validated aligner of a pair that needs one; each other open component
    gets a new ``Unmapped`` entry whose status and reason say what became of it) and returns what happened. Never
    raises for API, network, budget or model failures: those end as an outcome ``status`` and status
    ``unchecked`` on each component left. Components the rules mapped or explained are never touched. ``transcript_dir`` (the report
    directory): where a session that calls the API writes its transcript (:mod:`ekka_core.agent.transcript`)."""
    config = config if config is not None else AgentConfig.from_env()
    out = AgentOutcome(model=config.model, budget=config.budget_json(), notes=list(config.notes))
    open_ = {u.module: u for u in mapping.unmapped if u.open}
    if not open_:
        out.message = "the rules mapped or explained every component"
        return out
    out.asked = list(open_)
    transcript = Transcript(transcript_dir, secret=config.api_key)
    session = _Session(mapping, target_tree, reference_tree, traces, config, open_, out, client, transcript)
    try:
        session.run()
    except AgentStop as stop:
        session.stop = stop
    except Exception as e:                      # never crash the diagnosis over the agent
        session.stop = AgentStop("error", REASON_FAILED.format(why=f"{type(e).__name__}: {e}"[:200]),
                                 f"the agent failed: {type(e).__name__}: {e}")
    session.apply()
    if transcript.started:
        transcript.add("outcome", status=out.status, message=out.message, usage=out.usage.to_json(),
                       mapped=out.mapped, explained=out.explained, unchecked=out.unchecked)
        out.transcript = transcript.close()
    if transcript.error:
        out.notes.append(transcript.error)
    return out


class _Session:
    def __init__(self, mapping: Mapping, target: ModelTree, reference: ModelTree, traces: Any,
                 config: AgentConfig, open_: dict[str, Unmapped], out: AgentOutcome, client: Any,
                 transcript: Transcript):
        self.mapping, self.target, self.reference, self.traces = mapping, target, reference, traces
        self.config, self.open, self.out, self.client = config, open_, out, client
        self.transcript = transcript
        self.key = kb_key(target, reference, traces, config)
        out.kb_key = {k: v for k, v in self.key.__dict__.items()}
        self.kb = KnowledgeBase(config.resolved_kb_dir(), shipped=config.shipped_kb) if config.use_kb else None
        self.kb_verdict = Verdict()
        self.verdict = Verdict()                 # the agent's, for the components the knowledge base did not cover
        self.toolbox: Toolbox | None = None
        self.budget = Budget(config)
        self.stop: AgentStop | None = None
        self.kb_aligners: dict[str, dict[str, Any]] = {}
        self.stale: list[str] = []
        self.hints: list[dict[str, Any]] = []
        if not self.budget.price_known:
            out.notes.append(f"no price on file for {config.model!r}: the budget assumes "
                             f"${self.budget.price['input']}/${self.budget.price['output']} per million tokens")

    # ---- 1. knowledge base
    def from_knowledge_base(self) -> dict[str, Unmapped]:
        if self.kb is None:
            return dict(self.open)
        entries = self.kb.lookup(self.key)
        props: list[Proposal] = []
        expls: list[Explanation] = []
        n = len(entries)
        for rank, e in enumerate(entries):           # earlier entries are more specific: give them higher seq
            for item in [*e.mappings, *e.unmapped]:
                item.seq = (n - rank) * 100_000 + item.seq
            props += e.mappings
            expls += e.unmapped
        validator = Validator(self.target, self.reference, self.open, self.traces, self.config.match_tolerance)
        for e in entries:
            for a in e.aligners:
                for comp, i in validator.covers(str(a.get("target", ""))):
                    # Stored reference modules are patterns: {i} is this component's layer.
                    refs = [instantiate(str(r), i) for r in a.get("reference", [])]
                    prop = next((p for p in reversed(props) if match(p.target, comp) is not None), None)
                    if self._recheck_aligner(comp, a, refs, prop.split_sizes if prop else None):
                        validator.aligned.add(comp)
                        self.kb_aligners[comp] = {**a, "reference": refs, "origin": f"knowledge-base:{e.path.name}"}
        v = validator.run(props, expls)
        # A component the knowledge base does not cover is not a knowledge-base problem.
        self.kb_verdict = Verdict(v.confirmed, v.explained)
        used = {p.origin for _, p in v.confirmed.values()} | {x.origin for x in v.explained.values()}
        self.out.kb_used = [str(e.path) for e in entries if f"knowledge-base:{e.path.name}" in used]
        for comp, probs in v.rejected.items():
            self.stale.append(f"{comp}: a knowledge-base entry no longer validates ({probs[0]})")
        self.out.notes += self.stale
        if self.kb.errors:
            self.out.notes += [f"unreadable knowledge-base file skipped: {e}" for e in self.kb.errors]
        classes = {u.cls for u in self.open.values()}
        self.hints = self.kb.hints(classes, exclude={e.path for e in entries})
        return {c: u for c, u in self.open.items() if c not in v.confirmed and c not in v.explained}

    def _recheck_aligner(self, comp: str, a: dict[str, Any], refs: list[str], split_sizes: list[int] | None
                         ) -> bool:
        if self.traces is None or not a.get("source"):
            return bool(a.get("source"))
        from ekka_core.align.custom import aligner_inputs
        from ekka_core.align.sandbox import run_aligner
        try:
            inputs = aligner_inputs(self.traces.target, self.traces.reference, comp, refs, split_sizes=split_sizes)
            run_aligner(a["source"], inputs.target, inputs.reference, inputs.meta,
                        timeout_s=self.config.aligner_timeout_s)
            return True
        except Exception as e:
            self.stale.append(f"{comp}: a knowledge-base aligner no longer passes its self-checks ({e})")
            return False

    # ---- 2. the agent
    def run(self) -> None:
        remaining = self.from_knowledge_base()
        if not remaining:
            self.out.status = "knowledge-base"
            self.out.message = f"all {len(self.open)} component(s) from the knowledge base"
            return
        c = self.config
        if not c.enabled:
            raise AgentStop("disabled", REASON_DISABLED, "the agent is disabled (EKKA_AGENT=0)")
        if not c.api_key:
            raise AgentStop("no-api-key", REASON_NO_KEY,
                            f"{len(remaining)} component(s) need the mapping agent, but ANTHROPIC_API_KEY is not set")
        try:
            import anthropic  # noqa: F401
        except ImportError:
            raise AgentStop("no-sdk", REASON_NO_SDK, "the anthropic package is not installed: "
                                                     "pip install 'ekka[agent]'") from None
        validator = Validator(self.target, self.reference, remaining, self.traces, self.config.match_tolerance)
        tb = Toolbox(self.target, self.reference, remaining, validator, c, self.traces)
        self.toolbox = tb
        caller = Caller(c, self.client)
        self.transcript.add("session", model=c.model, endpoint=c.base_url or "https://api.anthropic.com",
                            api_key="set (not recorded)", budget=self.out.budget, kb_key=self.out.kb_key,
                            asked=list(self.open), from_knowledge_base=[k for k in self.open if k not in remaining],
                            remaining=list(remaining), system=SYSTEM, tools=TOOLS)
        try:
            self._loop(caller, tb, validator, remaining)
        finally:
            self.out.retries = caller.retries
            self.out.events += caller.events

    def _loop(self, caller: Caller, tb: Toolbox, validator: Validator, remaining: dict[str, Unmapped]) -> None:
        c, out = self.config, self.out
        system = [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
        messages: list[dict[str, Any]] = [{"role": "user", "content": self._first_message(remaining)}]
        finish_schema = next(t["input_schema"] for t in TOOLS if t["name"] == "finish")
        while True:
            if self.budget.usage.calls >= c.max_calls:
                raise AgentStop("gave-up", REASON_GAVE_UP.format(why=f"no validated result in {c.max_calls} calls"),
                                f"no validated mapping after {c.max_calls} API calls")
            request = {"model": c.model, "system": system, "tools": TOOLS, "messages": messages}
            estimated = estimate_tokens(request)       # serialises the whole conversation: once per call
            try:
                max_tokens = self.budget.allow(estimated)
            except BudgetExceeded as e:
                out.budget_exceeded = e.what
                raise AgentStop("budget-exceeded", REASON_BUDGET.format(what=e.what),
                                f"the agent's budget is spent: {e.detail}") from None
            self._record_request(messages, max_tokens, estimated)
            seen_events = len(caller.events)
            try:
                resp = caller.create(max_tokens=max_tokens, **request)
            finally:
                for event in caller.events[seen_events:]:
                    self.transcript.add("api_event", event=event)
            self.budget.record(getattr(resp, "usage", None) or {})
            content = [b for b in (_block_param(b) for b in (getattr(resp, "content", None) or []))
                       if not (b.get("type") == "text" and not str(b.get("text", "")).strip())]
            self.transcript.add("response", call=self.budget.usage.calls, content=content,
                                stop_reason=getattr(resp, "stop_reason", None),
                                usage=_usage_json(getattr(resp, "usage", None)))
            messages.append({"role": "assistant", "content": content or [{"type": "text", "text": "(no reply)"}]})
            uses = [b for b in content if b.get("type") == "tool_use"]
            results: list[dict[str, Any]] = []
            finish_id = None
            for u in uses:
                self.transcript.add("tool_call", id=u.get("id"), name=u.get("name"), input=u.get("input"))
                if u.get("name") == "finish" and not check_args(finish_schema, u.get("input")):
                    finish_id = u["id"]
                    continue
                r = tb.call(str(u.get("name")), u.get("input"))
                results.append({"type": "tool_result", "tool_use_id": u["id"], "content": r.content,
                                "is_error": r.is_error})
                self.transcript.add("tool_result", id=u.get("id"), name=u.get("name"), content=r.content,
                                    is_error=r.is_error, malformed=r.malformed)
            if tb.malformed >= c.max_malformed:
                raise AgentStop("gave-up", REASON_GAVE_UP.format(why=f"{tb.malformed} malformed tool calls"),
                                f"the model made {tb.malformed} malformed tool calls (limit {c.max_malformed})")
            stop_reason = getattr(resp, "stop_reason", None)
            if finish_id is not None or (not uses and stop_reason in ("end_turn", "stop_sequence")):
                out.rounds += 1
                self.verdict = validator.run(tb.proposals, tb.explanations, keep=self.verdict)
                out.validator_problems = list(self.verdict.problems)
                self.transcript.add("validator", round=out.rounds, confirmed=len(self.verdict.confirmed),
                                    explained=len(self.verdict.explained), problems=self.verdict.problems)
                if not self.verdict.problems:
                    out.status = "complete"
                    out.message = (f"validated in {out.rounds} round(s): {len(self.verdict.confirmed)} mapped, "
                                   f"{len(self.verdict.explained)} explained")
                    self._store()
                    return
                if out.rounds >= c.max_rounds:
                    raise AgentStop("incomplete", "", f"the validator still rejects {len(self.verdict.problems)} "
                                                      f"item(s) after {out.rounds} rounds")
                feedback = (f"Validator, round {out.rounds} of {c.max_rounds}: {len(self.verdict.confirmed)} "
                            f"confirmed, {len(self.verdict.explained)} explained. Fix these, then call finish "
                            "again:\n- " + "\n- ".join(self.verdict.problems))
                if finish_id is not None:
                    results.append({"type": "tool_result", "tool_use_id": finish_id, "content": feedback,
                                    "is_error": True})
                    self.transcript.add("tool_result", id=finish_id, name="finish", content=feedback, is_error=True,
                                        malformed=False)
                else:
                    results.append({"type": "text", "text": feedback})
            elif not uses:
                if stop_reason == "refusal":
                    raise AgentStop("gave-up", REASON_GAVE_UP.format(why="the model declined"),
                                    "the model declined the task (stop_reason refusal)")
                results.append({"type": "text", "text": "Continue with the tools; call finish when every component "
                                                        "is proposed or explained."})
            messages.append({"role": "user", "content": results})

    def _record_request(self, messages: list[dict[str, Any]], max_tokens: int, estimated: int) -> None:
        """The transcript's request record: the user text new in this request (the first message, validator
        feedback sent as text, a nudge); tool results are recorded as they are made. Opens the files."""
        last = messages[-1]["content"]
        texts = [last] if isinstance(last, str) else [b["text"] for b in last if b.get("type") == "text"]
        self.transcript.add("request", call=self.budget.usage.calls + 1, max_tokens=max_tokens,
                            estimated_input_tokens=estimated, messages=len(messages), new_user_text=texts)
        self.transcript.start()

    def _first_message(self, remaining: dict[str, Unmapped]) -> str:
        from ekka_core.align.template import TEMPLATE

        t, r = self.target, self.reference
        k = self.key
        lines = [f"Target: {t.framework} {k.target_version} ({k.target_class}); reference: {r.framework} "
                 f"{k.reference_version} ({k.reference_class}).",
                 f"The rules mapped {len(self.mapping.pairs)} components. These {len(remaining)} target "
                 "components have no rule yet:"]
        for comp, u in list(remaining.items())[:200]:
            node = t.modules.get(comp)
            width = f", out_features {node.out_features}" if node is not None and node.out_features else ""
            where = f", {node.class_file}:{node.class_line}" if node is not None and node.class_file else ""
            lines.append(f"- {comp}  class {u.cls}{width}{where}")
        if len(remaining) > 200:
            lines.append(f"- … and {len(remaining) - 200} more")
        examples = self.mapping.pairs[:10]
        if examples:
            lines.append("\nSome pairs the rules made (for orientation; do not re-map them):")
            lines += [f"- {p.component} ↔ {', '.join(p.reference.modules)} [{p.relation}, {p.rule}]"
                      for p in examples]
        if self.hints:
            lines.append("\nValidated mappings of the same classes in other models (knowledge base):")
            lines += [f"- {json.dumps(h)}" for h in self.hints]
        if self.stale:
            lines.append("\nKnowledge-base entries that no longer validate for this model:")
            lines += [f"- {s}" for s in self.stale]
        if self.traces is not None:
            lines.append("\nTraces are available: get_tensor_sum and infer_tensor_match compare real tensors. "
                         "If a pair needs a custom aligner, propose_aligner takes code in this fixed template:\n"
                         f"```python\n{TEMPLATE}```")
        else:
            lines.append("\nNo traces are available in this session: decide from the trees and the class sources.")
        lines.append("\nPropose or explain every component above, then call finish.")
        return "\n".join(lines)

    def _store(self) -> None:
        if self.kb is None or not self.config.write_kb or self.toolbox is None:
            return
        agent = {c: v for c, v in self.verdict.confirmed.items() if v[1].origin == "agent"}
        mappings = generalize(agent, self.toolbox.open)
        expls = []
        for comp, e in self.verdict.explained.items():
            if e.origin == "agent" and all(x.target != e.target for x in expls):
                expls.append(Explanation(e.target, e.reason, self.open[comp].cls if comp in self.open else None))
        aligners = []
        for comp, a in self.toolbox.aligners.items():
            if comp in self.verdict.confirmed and all(x["target"] != a["target"] for x in aligners):
                aligners.append({"target": a["target"], "reference": a["reference_pattern"], "source": a["source"],
                                 "checks": a["checks"]})
        if not (mappings or expls or aligners):
            return
        try:
            path = self.kb.store(self.key, mappings, expls, aligners, model=self.config.model)
        except OSError as e:
            self.out.notes.append(f"could not write the knowledge base: {e}")
            return
        if path is not None:
            self.out.kb_written.append(str(path))

    # ---- 3. the mapping
    def apply(self) -> None:
        out, stop = self.out, self.stop
        if stop is not None:
            out.status, out.message = stop.status, stop.message
        out.usage = self.budget.usage
        out.budget_exceeded = out.budget_exceeded or self.budget.exceeded
        if self.toolbox is not None:
            tb = self.toolbox
            out.tool_calls, out.tool_errors, out.malformed_tool_calls = tb.calls, tb.errors, tb.malformed
        confirmed = {**self.kb_verdict.confirmed, **self.verdict.confirmed}
        explained = {**self.kb_verdict.explained, **self.verdict.explained}
        aligners = {**self.kb_aligners, **(self.toolbox.aligners if self.toolbox else {})}
        settled: dict[str, Unmapped] = {}            # open component -> what it became (replaces its entry)
        new_pairs = []
        part_of: dict[str, str] = {}
        for comp, (pair, prop) in confirmed.items():
            new_pairs.append(pair)
            for other in pair.target.modules[1:]:
                part_of[other] = comp
            if prop.origin == "agent":
                out.mapped.append(comp)
            else:
                out.from_kb.append(comp)
            if comp in aligners:
                a = aligners[comp]
                if list(a.get("reference", [])) == pair.reference.modules:
                    pair.aligner = a["source"]           # the align stage runs it (sandboxed) for this pair
                    out.aligners[comp] = {k: v for k, v in a.items() if k not in ("seq", "reference_pattern")}
                else:
                    out.notes.append(f"{comp}: its aligner was checked against {a.get('reference')}, not the "
                                     f"mapped {pair.reference.modules}; the built-in alignment is used")
        for comp, e in explained.items():
            reason = f"agent: {e.reason}" if e.origin == "agent" else f"knowledge base: {e.reason}"
            settled[comp] = self._settle(comp, reason, AGENT_EXPLAINED)
            (out.explained if e.origin == "agent" else out.from_kb).append(comp)
        for comp in self.open:
            if comp in confirmed or comp in explained:
                continue
            if comp in part_of:
                settled[comp] = self._settle(comp, f"compared as part of {part_of[comp]} (N:1)", AGENT_MAPPED)
                continue
            if stop is not None and stop.reason:
                reason = stop.reason
            else:
                why = self.verdict.rejected.get(comp, ["neither mapped nor explained"])[0]
                reason = REASON_GAVE_UP.format(why=why)
            settled[comp] = self._settle(comp, reason, UNCHECKED)
            out.unchecked.append({"module": comp, "reason": reason})
        done = set(confirmed)
        self.mapping.unmapped = [settled.get(u.module, u) for u in self.mapping.unmapped if u.module not in done]
        self.mapping.pairs += new_pairs
        if stop is None and out.status not in OK_STATUSES:
            out.status = "error"

    def _settle(self, comp: str, reason: str, status: str) -> Unmapped:
        return Unmapped(comp, self.open[comp].cls, reason, status)


def _usage_json(usage: Any) -> dict[str, Any]:
    if usage is None:
        return {}
    if isinstance(usage, dict):
        return dict(usage)
    if hasattr(usage, "model_dump"):
        return usage.model_dump(exclude_none=True, mode="json")
    return {k: getattr(usage, k, None) for k in ("input_tokens", "output_tokens")}


def _block_param(b: Any) -> dict[str, Any]:
    """A response content block as a request block, unchanged in substance (thinking blocks keep their
    signature: the API requires them back as they were)."""
    t = getattr(b, "type", None) if not isinstance(b, dict) else b.get("type")
    if isinstance(b, dict):
        return dict(b)
    if t == "text":
        return {"type": "text", "text": b.text}
    if t == "tool_use":
        return {"type": "tool_use", "id": b.id, "name": b.name, "input": b.input}
    if hasattr(b, "model_dump"):
        return b.model_dump(exclude_none=True, mode="json")
    return {"type": str(t)}
