"""What a repro script sends its engine: the generation calls (``llm.generate``, ``llm.chat``, ``engine.generate``,
``async_generate``) and their inputs — prompt text, chat ``messages`` or ``prompt_token_ids`` (``TokensPrompt(...)``,
``{"prompt_token_ids": [...]}``, the ``prompt_token_ids=`` / ``input_ids=`` keywords) — with each request's
``max_tokens``.

One call's requests are sent together (a *wave*); a call in a ``for`` loop sends one wave per iteration; calls run
one after the other. A single wave becomes the spec's top-level ``prompts`` / ``messages`` / ``prompt_token_ids``;
several become a request scenario (spec ``requests``: every request of a wave waits, with ``after``, for the last
request of the wave before it) — what prefix-cache and batching bugs need.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import libcst as cst

from ekka_core.repro.engine import Engine
from ekka_core.repro.script import Each, Script, Unknown, Unresolved
from ekka_core.repro.toml import toml_problem

METHODS = ("generate", "chat", "async_generate", "beam_search")
MAX_TOKENS_KW = {"vllm": "max_tokens", "sglang": "max_new_tokens"}
DEFAULT_MAX_TOKENS = {"vllm": 16, "sglang": 128}
_UNSUPPORTED_KW = (("lora_request", "a LoRA adapter"), ("image_data", "multimodal input"),
                   ("multi_modal_data", "multimodal input"))
_IDS_KW = ("prompt_token_ids", "input_ids")


@dataclass(frozen=True)
class Opaque:
    """A sampling parameter whose value is not a literal (it is ignored anyway: Ekka decodes greedily)."""

    text: str

    def __repr__(self) -> str:
        return self.text


def show(v: Any) -> str:
    return v.text if isinstance(v, Opaque) else repr(v)


@dataclass
class Input:
    """One request: ``kind`` is ``prompt``, ``messages`` or ``prompt_token_ids``; ``sampling`` its parameters
    (``max_new_tokens`` spelled so for both engines; None: the call's sampling parameters could not be read)."""

    kind: str
    value: Any
    sampling: dict[str, Any] | None = None
    node: cst.CSTNode | None = None


@dataclass
class Wave:
    """Requests sent together: one generation call, or one iteration of the loop it is in."""

    line: int
    engine: Engine
    inputs: list[Input] = field(default_factory=list)


def generation_calls(script: Script, engines: list[Engine]) -> tuple[list[tuple[Engine, cst.Call, str]],
                                                                     list[cst.Call]]:
    """The calls that generate with one of ``engines`` (in source order), and other ``generate``-like calls."""
    by_call = {id(e.call): e for e in engines}
    by_receiver = {r: e for e in engines for r in e.receivers}
    matched, candidates = [], []
    for call in script.calls:
        func = call.func
        if not isinstance(func, cst.Attribute) or func.attr.value not in METHODS:
            continue
        method = func.attr.value
        recv = func.value
        if isinstance(recv, cst.NamedExpr):  # (llm := LLM(...)).generate(...)
            recv = recv.value
        eng = by_call.get(id(recv)) or by_receiver.get(" ".join(script.code(recv).split()))
        if eng is None and isinstance(recv, cst.Name):
            try:
                eng = by_call.get(id(script.deref(recv)))
            except Unresolved:
                pass
        if eng is None or (method == "chat" and eng.kind != "vllm"):
            candidates.append(call)
            continue
        matched.append((eng, call, method))
    return matched, candidates


def read_call(script: Script, eng: Engine, call: cst.Call, method: str,
              sampling_seen: list[tuple[cst.CSTNode, dict[str, Any]]]) -> list[Wave]:
    """The waves one generation call sends (empty when its inputs are not known before the script runs: each
    reason is an Unknown). Its sampling parameters go to ``sampling_seen`` for the notes."""
    kind = eng.kind
    positional = [a for a in call.args if a.keyword is None and not a.star]
    kwargs = {a.keyword.value: a for a in call.args if a.keyword is not None}
    if any(a.star for a in call.args):
        script.add_unknown("prompts", Unresolved(call, "arguments passed with * or **"),
                           "pass the prompts and sampling parameters explicitly")
    if method == "beam_search":
        script.add_unknown("prompts", Unresolved(call, "beam search"),
                           "Ekka diagnoses greedy decoding; use llm.generate with the same prompts")
        return []
    for bad, why in _UNSUPPORTED_KW:
        if bad in kwargs:
            script.add_unknown("prompts", Unresolved(kwargs[bad], f"the call passes {why}"),
                               "Ekka diagnoses text, chat or token-id prompts on the base model")
            return []
    first_kw = {"vllm": "messages" if method == "chat" else "prompts", "sglang": "prompt"}[kind]
    prompt_arg = kwargs[first_kw].value if first_kw in kwargs else positional[0].value if positional else None
    ids_arg = next((kwargs[k].value for k in _IDS_KW if k in kwargs), None)
    sp_arg = (kwargs["sampling_params"].value if "sampling_params" in kwargs
              else positional[1].value if len(positional) > 1 else None)
    if method == "chat":
        groups = _chat(script, call, prompt_arg, kwargs)
    elif prompt_arg is not None:
        groups = _prompts(script, prompt_arg)
    elif ids_arg is not None:
        groups = _token_ids(script, ids_arg)
    else:
        script.add_unknown("prompts", Unresolved(call, "the call passes no prompt"), "add the prompt text")
        groups = []
    sampling = _sampling(script, kind, call, sp_arg)
    sampling_seen += [(sp_arg or call, p) for p in (sampling or [])]
    if not groups:
        return []
    repeats = _repeats(script, call, prompt_arg if prompt_arg is not None else ids_arg)
    waves = []
    for _ in range(repeats):
        for inputs in groups:
            waves.append(Wave(script.line(call), eng, _with_sampling(script, call, inputs, sampling)))
    return waves


def _with_sampling(script: Script, call: cst.Call, inputs: list[Input],
                   sampling: list[dict[str, Any]] | None) -> list[Input]:
    """vLLM's rule: one SamplingParams for every prompt, or one per prompt."""
    if sampling is None:
        return [Input(i.kind, i.value, None, i.node) for i in inputs]
    if len(sampling) == 1 or len({json.dumps(s, sort_keys=True, default=str) for s in sampling}) == 1:
        return [Input(i.kind, i.value, dict(sampling[0]), i.node) for i in inputs]
    if len(sampling) != len(inputs):
        script.add(Unknown("max_new_tokens", script.line(call), script.snippet(call),
                           f"{len(sampling)} sampling parameter sets for {len(inputs)} prompts",
                           "give one SamplingParams, or one per prompt"))
        return [Input(i.kind, i.value, None, i.node) for i in inputs]
    return [Input(i.kind, i.value, dict(s), i.node) for i, s in zip(inputs, sampling)]


def _repeats(script: Script, call: cst.Call, arg: cst.BaseExpression | None) -> int:
    """How often the call runs because of ``for`` loops around it that its prompts do not iterate over
    (``for _ in range(2): llm.generate(prompts)``); 1 when none, or when the count is known only at run time
    (noted)."""
    own_loop = None
    if arg is not None:
        try:
            bound = script.deref(arg)
            own_loop = bound.loop if isinstance(bound, Each) else None
        except Unresolved:
            pass
    n, child, node = 1, call, script.parents.get(call)
    while node is not None and not isinstance(node, (cst.FunctionDef, cst.ClassDef, cst.Module)):
        in_body = isinstance(node, (cst.For, cst.While)) and child is node.body
        child, node = node, script.parents.get(node)
        if not in_body:
            continue                                # ``for out in llm.generate(...)``: the call is the iterable
        loop = child
        if isinstance(loop, cst.For) and loop is not own_loop:
            try:
                n *= len(script.iterable(loop.iter))
            except Unresolved:
                script.note(f"the generation call at line {script.line(call)} is inside a loop (line "
                            f"{script.line(loop)}) whose length is known only at run time; its requests are sent "
                            "once")
        elif isinstance(loop, cst.While):
            script.note(f"the generation call at line {script.line(call)} is inside a while loop (line "
                        f"{script.line(loop)}); its requests are sent once")
    return n


def _prompts(script: Script, arg: cst.BaseExpression) -> list[list[Input]]:
    """The inputs of a ``generate``: text, ``{"prompt": …}``, ``{"prompt_token_ids": […]}`` or
    ``TokensPrompt(...)``, one list per wave (a ``for`` loop over them: one wave per element)."""
    hint = "put the prompt text in `prompts` (or the ids in `prompt_token_ids`)"
    try:
        bound = script.deref(arg)
        if isinstance(bound, Each):
            per_wave = [item if isinstance(item, list) else [item] for item in bound.items]
            script.note(f"the script generates one prompt at a time in a loop (line {script.line(bound.loop)}): "
                        "each iteration is a request sent once the previous one has finished")
        else:
            value = script.value(bound)
            per_wave = [_as_batch(value)]
    except Unresolved as e:
        script.add_unknown("prompts", e, hint)
        return []
    waves = []
    for items in per_wave:
        inputs = []
        for item in items:
            got = _one_prompt(script, arg, item, hint)
            if got is not None:
                inputs.append(got)
        if inputs:
            waves.append(inputs)
    return waves


def _as_batch(value: Any) -> list[Any]:
    """A list of prompts, or one prompt (a string, a prompt dict, or one request's token-id list)."""
    if isinstance(value, list) and value and all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        return [{"prompt_token_ids": value}]
    return value if isinstance(value, list) else [value]


def _one_prompt(script: Script, arg: cst.BaseExpression, item: Any, hint: str) -> Input | None:
    if isinstance(item, dict):
        keys = set(item)
        if keys == {"prompt"} and isinstance(item["prompt"], str):
            item = item["prompt"]
        elif keys == {"prompt_token_ids"}:
            return _ids_input(script, arg, item["prompt_token_ids"])
        else:
            extra = sorted(keys - {"prompt", "prompt_token_ids"})
            script.add_unknown("prompts", Unresolved(arg, "a prompt dict with "
                                                     + (", ".join(extra) or "no text `prompt`")),
                               "Ekka diagnoses text, chat or token-id prompts; give the prompt text or ids")
            return None
    if not isinstance(item, str) or toml_problem(item):
        why = toml_problem(item) if isinstance(item, str) else f"not text ({type(item).__name__})"
        script.add_unknown("prompts", Unresolved(arg, f"a prompt that is {why}"), hint)
        return None
    return Input("prompt", item, node=arg)


def _ids_input(script: Script, node: cst.CSTNode, ids: Any) -> Input | None:
    if not (isinstance(ids, list) and ids and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0
                                                  for t in ids)):
        script.add_unknown("prompt_token_ids", Unresolved(node, "token ids that are not a list of non-negative "
                                                          "integers"), "write the ids out, e.g. [1, 415, 2936]")
        return None
    return Input("prompt_token_ids", list(ids), node=node)


def _token_ids(script: Script, arg: cst.BaseExpression) -> list[list[Input]]:
    """``prompt_token_ids=[[…], …]`` (vLLM's older keyword) or SGLang's ``input_ids=``: one request per list."""
    try:
        value = script.value(arg)
    except Unresolved as e:
        script.add_unknown("prompt_token_ids", e, "write the token ids out in `prompt_token_ids`")
        return []
    lists = value if isinstance(value, list) and value and all(isinstance(x, list) for x in value) else [value]
    inputs = [i for i in (_ids_input(script, arg, ids) for ids in lists) if i is not None]
    return [inputs] if inputs else []


def _chat(script: Script, call: cst.Call, arg: cst.BaseExpression | None,
          kwargs: dict[str, cst.Arg]) -> list[list[Input]]:
    """``llm.chat``'s conversations (one, or a batch of them), each a ``messages`` request: every framework renders
    them with its own chat template (a difference is itself a finding)."""
    hint = "write the conversation out as [[messages]] tables (role, content)"
    if arg is None:
        script.add_unknown("messages", Unresolved(call, "llm.chat without messages"), hint)
        return []
    try:
        value = script.value(arg)
    except Unresolved as e:
        script.add_unknown("messages", e, hint)
        return []
    convs = value if value and all(isinstance(c, list) for c in value) else [value]
    for conv in convs:
        if not (isinstance(conv, list) and conv and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in conv)) or toml_problem(conv):
            script.add_unknown("messages", Unresolved(arg, "messages are not a list of {role, content} dicts with "
                                                      "text content"), hint)
            return []
    if "chat_template" in kwargs:
        script.add_unknown("messages", Unresolved(kwargs["chat_template"], "llm.chat with a custom chat_template"),
                           "Ekka renders the messages with each framework's own chat template; render them with "
                           "this template into prompt text and give `prompts` instead")
        return []
    other = sorted(k for k in kwargs if k not in ("messages", "sampling_params", "use_tqdm"))
    if other:
        script.note(f"llm.chat at line {script.line(call)}: arguments not imported: {', '.join(other)}")
    script.note(f"llm.chat at line {script.line(call)}: the conversation is imported as `messages`; each "
                "framework renders it with its own chat template")
    return [[Input("messages", conv, node=arg) for conv in convs]]


def _sampling(script: Script, kind: str, call: cst.Call, arg: cst.BaseExpression | None
              ) -> list[dict[str, Any]] | None:
    """The call's sampling parameter sets (``max_new_tokens`` spelled so for both engines); None when unknown."""
    if arg is None:
        return [{}]
    try:
        node = script.deref(arg)
        if isinstance(node, Each):
            raise Unresolved(arg, "sampling parameters from a loop variable")
        if kind == "vllm":
            items = _sampling_params_list(script, node)
        else:
            value = script.value(node)
            items = value if isinstance(value, list) else [value]
            if not all(isinstance(i, dict) for i in items):
                raise Unresolved(arg, "sampling_params is not a dict")
    except Unresolved as e:
        script.add_unknown("max_new_tokens", e, f"set `max_new_tokens` to the script's {MAX_TOKENS_KW[kind]}")
        return None
    key = MAX_TOKENS_KW[kind]
    out = []
    for params in items:
        params = dict(params)
        if key in params:  # one spelling for both engines: "max_new_tokens"
            params["max_new_tokens"] = params.pop(key)
        elif key != "max_new_tokens":
            params.pop("max_new_tokens", None)
        out.append(params)
    return out


def _sampling_params_list(script: Script, node: cst.BaseExpression) -> list[dict[str, Any]]:
    if isinstance(node, (cst.List, cst.Tuple)):
        return [p for el in node.elements for p in _sampling_params_list(script, _deref_plain(script, el.value))]
    if isinstance(node, cst.BinaryOperation) and isinstance(node.operator, cst.Multiply):
        return _sampling_params_list(script, _deref_plain(script, node.left))   # copies of the same parameters
    if isinstance(node, cst.Call) and script.qualname(node.func) == "vllm.SamplingParams":
        params: dict[str, Any] = {}
        for a in node.args:
            if a.star == "**":
                try:
                    splat = script.value(a.value)
                except Unresolved:
                    raise Unresolved(a, "`**` of sampling parameters known only at run time") from None
                if not isinstance(splat, dict) or not all(isinstance(k, str) for k in splat):
                    raise Unresolved(a, "`**` of something that is not a dict of names")
                params.update(splat)
            elif a.keyword is None:
                raise Unresolved(a, "positional SamplingParams argument")
            else:
                try:
                    params[a.keyword.value] = script.value(a.value)
                except Unresolved as e:
                    if a.keyword.value == "max_tokens":
                        raise
                    params[a.keyword.value] = Opaque(script.snippet(e.node))
        return [params]
    if isinstance(node, cst.Subscript) and len(node.slice) == 1 and isinstance(node.slice[0].slice, cst.Index):
        items = _sampling_params_list(script, _deref_plain(script, node.value))
        idx = script.value(node.slice[0].slice.value)
        if isinstance(idx, int) and not isinstance(idx, bool) and -len(items) <= idx < len(items):
            return [items[idx]]
    if isinstance(node, cst.Name) and node.value == "None":
        return [{}]
    raise Unresolved(node, "not a SamplingParams(...) call")


def _deref_plain(script: Script, node: cst.BaseExpression) -> cst.BaseExpression:
    bound = script.deref(node)
    if isinstance(bound, Each):
        raise Unresolved(node, "sampling parameters from a loop variable")
    return bound


# ---------------------------------------------------------------------------------------------------- the spec


def drop_repeats_across_engines(script: Script, waves: list[Wave]) -> list[Wave]:
    """A script that builds several engines and sends each the same requests compares the engines: those requests
    count once (the engines' settings are compared in :func:`~ekka_core.repro.engine.merge_engines`)."""
    seen: list[tuple[Engine, str]] = []
    kept = []
    for w in waves:
        key = json.dumps([(i.kind, i.value) for i in w.inputs], sort_keys=True)
        if any(key == k and e is not w.engine for e, k in seen):
            script.note(f"the requests at line {w.line} repeat another engine's: they count once")
            continue
        seen.append((w.engine, key))
        kept.append(w)
    return kept


def add_inputs(script: Script, kind: str, waves: list[Wave], sampling_seen: list[tuple[cst.CSTNode, dict]],
               fields: dict[str, Any]) -> None:
    """The spec's inputs from the waves: top-level fields for one wave of one kind (one conversation at most) and
    one max_tokens; a ``requests`` scenario otherwise."""
    inputs = [i for w in waves for i in w.inputs]
    mts = {json.dumps((i.sampling or {}).get("max_new_tokens"), default=str) for i in inputs}
    kinds = {i.kind for i in inputs}
    if len(waves) <= 1 and len(kinds) <= 1 and len(mts) <= 1 \
            and not (kinds == {"messages"} and len(inputs) > 1):
        if inputs:
            name = {"prompt": "prompts", "messages": "messages", "prompt_token_ids": "prompt_token_ids"}[inputs[0].kind]
            fields[name] = inputs[0].value if name == "messages" else [i.value for i in inputs]
        _merge_max_tokens(script, kind, sampling_seen, fields)
    else:
        _scenario(script, kind, waves, fields)
    _sampling_notes(script, sampling_seen)


def _scenario(script: Script, kind: str, waves: list[Wave], fields: dict[str, Any]) -> None:
    key = MAX_TOKENS_KW[kind]
    valid: list[int] = []
    for w in waves:
        for i in w.inputs:
            mt = (i.sampling or {}).get("max_new_tokens")
            if mt is not None and not _in_range(mt):
                script.add(Unknown("max_new_tokens", w.line, script.snippet(i.node) if i.node else "",
                                   f"{key}={show(mt)} is outside Ekka's range 1..4096",
                                   "a numerical divergence shows within the first tokens: use e.g. 32"))
            elif mt is not None:
                valid.append(mt)
    common = Counter(valid).most_common(1)[0][0] if valid else None
    if common is not None:
        fields["max_new_tokens"] = common
    if len(valid) < sum(len(w.inputs) for w in waves):
        script.note(f"some requests do not set {key} (the engine's default is {DEFAULT_MAX_TOKENS[kind]}); they "
                    "keep the spec's max_new_tokens")
    requests: list[dict[str, Any]] = []
    previous: str | None = None
    for w in waves:
        last = None
        for i in w.inputs:
            r: dict[str, Any] = {"id": str(len(requests)), i.kind: i.value}
            mt = (i.sampling or {}).get("max_new_tokens")
            if mt is not None and _in_range(mt) and mt != common:
                r["max_new_tokens"] = mt
            if previous is not None:
                r["after"] = previous
            requests.append(r)
            last = r["id"]
        previous = last
    fields["requests"] = requests
    if len(waves) > 1:
        script.note(f"the script sends {len(waves)} rounds of requests one after the other (lines "
                    f"{', '.join(dict.fromkeys(str(w.line) for w in waves))}): a request scenario, each round "
                    "sent once the one before has finished")


def _in_range(mt: Any) -> bool:
    return isinstance(mt, int) and not isinstance(mt, bool) and 1 <= mt <= 4096


def _merge_max_tokens(script: Script, kind: str, sampling: list[tuple[cst.CSTNode, dict[str, Any]]],
                      fields: dict[str, Any]) -> None:
    """One setting for every generation call (the calls whose inputs are unknown count too)."""
    if not sampling:
        return
    key, canon = MAX_TOKENS_KW[kind], "max_new_tokens"
    values = {json.dumps(p.get(canon), sort_keys=True, default=str) for _, p in sampling}
    if len(values) > 1:
        node = sampling[0][0]
        shown = ", ".join(f"line {script.line(n)}: {show(p[canon]) if canon in p else 'not set'}" for n, p in sampling)
        script.add(Unknown("max_new_tokens", script.line(node), script.snippet(node),
                           f"the generation calls use different {key} ({shown})",
                           "Ekka runs one setting; set `max_new_tokens` to the one that shows the bug"))
        return
    mt = sampling[0][1].get(canon)
    if mt is None:
        script.note(f"the script does not set {key} (the engine's default is {DEFAULT_MAX_TOKENS[kind]}); "
                    "the spec keeps Ekka's default max_new_tokens")
    elif _in_range(mt):
        fields["max_new_tokens"] = mt
    else:
        node = sampling[0][0]
        script.add(Unknown("max_new_tokens", script.line(node), script.snippet(node),
                           f"{key}={mt!r} is outside Ekka's range 1..4096",
                           "a numerical divergence shows within the first tokens: use e.g. 32"))


def _sampling_notes(script: Script, sampling: list[tuple[cst.CSTNode, dict[str, Any]]]) -> None:
    if not sampling:
        return
    temps = {show(p["temperature"]) if "temperature" in p else "unset (the engine's default, usually 1.0)"
             for _, p in sampling}
    if not temps <= {"0", "0.0"}:
        script.note(f"the script samples with temperature {', '.join(sorted(temps))}; Ekka diagnoses with greedy "
                    "decoding (temperature 0)")
    ignored = sorted({f"{k}={show(v)}" for _, p in sampling for k, v in p.items()
                      if k not in ("max_new_tokens", "temperature", "stream")})
    if ignored:
        script.note(f"sampling parameters not used by Ekka (it decodes greedily): {', '.join(ignored)}")
