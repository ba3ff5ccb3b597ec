"""The mapping stage — component mapping: which target module computes what which reference module(s) compute.

Entry point: :func:`map_components` (its rules: :mod:`~ekka_core.mapping.rules`; turning them off for the mapping
agent: :mod:`~ekka_core.mapping.switch`). A mapping is a JSON artefact: save it, edit it, load it back
(:func:`Mapping.load`).
"""

from ekka_core.contracts.mapping import (EXPLAINED, NO_RULE, RULES_OFF, SCHEMA, ComponentPair, Endpoint, Mapping,
                                         Unmapped)
from ekka_core.mapping.rules import SGLANG_LAYER_REASON, map_components
from ekka_core.mapping.switch import RULES_ENV, RULES_OFF_REASON, rules_enabled

__all__ = ["SCHEMA", "ComponentPair", "Endpoint", "Mapping", "Unmapped", "map_components", "rules_enabled",
           "EXPLAINED", "NO_RULE", "RULES_OFF", "RULES_ENV", "RULES_OFF_REASON", "SGLANG_LAYER_REASON"]
