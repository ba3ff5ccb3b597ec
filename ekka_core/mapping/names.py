"""Module names across frameworks: a reference module's path as the engine names it (its ``hf_to_vllm_mapper``)."""

from __future__ import annotations


def _to_target_name(ref_name: str, rename: dict[str, dict[str, str | None]]) -> str:
    name = ref_name
    for old, new in (rename.get("orig_to_new_prefix") or {}).items():
        if new is not None and (name + ".").startswith(old):
            name = (new + (name + ".")[len(old):]).rstrip(".")
    for old, new in (rename.get("orig_to_new_substr") or {}).items():
        if new is not None and old in name:
            name = name.replace(old, new)
    return name
