"""The mapping stage, second half — the component-mapping agent, for what the deterministic rules cannot place.

Entry point: :func:`complete_mapping`. It is only called for components that :func:`ekka_core.mapping.map_components`
left open (``Unmapped`` with status ``no-rule`` or ``rules-off``); rule-made pairs are never touched. In order:

1. **Knowledge base** (:mod:`ekka_core.agent.kb`, $0, offline): validated results of earlier runs for the same
   (target framework + version, reference framework + version, model classes), plus the entries shipped in
   ``ekka_core/agent/knowledge/``. Each entry is re-validated against this run's trees/traces before use.
2. **Agent** (Anthropic Messages API with tool use, :mod:`ekka_core.agent.session`): tools ``get_model_tree``,
   ``get_class_definition``, ``get_tensor_sum``, ``infer_tensor_match``, ``propose_mapping``,
   ``explain_unmapped``, ``propose_aligner`` (sandboxed, self-checked), ``finish``. After ``finish`` a
   **validator** (:mod:`ekka_core.agent.proposals`) checks every proposal; its problems go back to the model for
   at most ``max_rounds`` rounds. A **hard budget** (input/output tokens, dollars from a per-model price table) is
   checked before every call. Validated results are written to the knowledge base; a validated aligner rides on
   its pair (``ComponentPair.aligner``) into the align stage, which runs it sandboxed. Every session that calls the
   API leaves a transcript in the report directory (:mod:`ekka_core.agent.transcript`).
3. **Never a crash**: no API key, network down, 401, persistent 429/5xx, timeouts, budget spent, malformed tool
   calls — each ends as an :class:`AgentOutcome` ``status`` and status ``unchecked`` (with an ``unchecked: …``
   reason) on every component left unmapped.

    outcome = complete_mapping(mapping, t_tree, r_tree, traces=Traces(...), config=AgentConfig.from_env(),
                               transcript_dir=out_dir)
    report = build_report(ranking, spec=spec, meta=meta, agent=outcome.to_report())   # report.agent
"""

from __future__ import annotations

from ekka_core.agent.api import (REASON_BUDGET, REASON_KEY_REJECTED, REASON_NO_KEY, REASON_TIMEOUT,
                                 REASON_UNREACHABLE, AgentStop)
from ekka_core.agent.budget import Budget, BudgetExceeded, Usage
from ekka_core.agent.config import DEFAULT_MODEL, PRICES, AgentConfig, price_for
from ekka_core.agent.kb import SCHEMA as KB_SCHEMA
from ekka_core.agent.kb import SHIPPED_DIR, KBKey, KnowledgeBase
from ekka_core.agent.proposals import Explanation, Proposal, Validator
from ekka_core.agent.session import AgentOutcome, complete_mapping
from ekka_core.agent.tools import TOOLS

__all__ = [
    "AgentConfig", "AgentOutcome", "AgentStop", "Budget", "BudgetExceeded", "DEFAULT_MODEL", "Explanation",
    "KBKey", "KB_SCHEMA", "KnowledgeBase", "PRICES", "Proposal", "REASON_BUDGET", "REASON_KEY_REJECTED",
    "REASON_NO_KEY", "REASON_TIMEOUT", "REASON_UNREACHABLE", "SHIPPED_DIR", "TOOLS", "Usage", "Validator",
    "complete_mapping", "price_for",
]
