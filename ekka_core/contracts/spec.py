"""DiagnosisSpec: everything that defines one diagnosis. Built from CLI flags, a TOML spec file, a repro script or a
served trace; crosses processes as JSON (:meth:`DiagnosisSpec.to_json` / :meth:`DiagnosisSpec.from_json`).

Inputs, as users send them to the engine (:class:`RequestSpec`): prompt text, chat ``messages`` (each framework
renders them with its own chat template: a difference is itself a finding), or ``prompt_token_ids``. A spec gives
one kind at the top level (``prompts`` / ``messages`` / ``prompt_token_ids``, all sent together), or a scenario of
``requests`` with an order (``after``: sent once that request has finished; requests with the same ``after`` are
sent together) — what prefix-cache and batching bugs need.

``engine_args`` is the **served configuration**: the engine arguments the user runs with, kept as given. Where a
traced run has to differ from it (hooks cannot see into a compiled graph), the capture records each change and why.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ekka_core.contracts.errors import BadInput

TARGETS = ("vllm", "sglang")
REFERENCES = ("hf",)
DTYPES = ("bfloat16", "float16", "float32")
# "auto": the checkpoint's own dtype (config.json `dtype` / `torch_dtype`), resolved before anything runs.
SPEC_DTYPES = ("auto",) + DTYPES
INPUT_KINDS = ("prompt", "messages", "prompt_token_ids")


PositionRanges = list[tuple[int, int | None]]   # inclusive [start, end]; end None: to the end of the sequence


def parse_positions(text: str) -> PositionRanges:
    """``"0-15,32,40-"`` → ``[(0, 15), (32, 32), (40, None)]``: token positions (0-based, in the sequence) to
    trace. Raises BadInput naming the bad item."""
    ranges: PositionRanges = []
    for item in (x.strip() for x in text.split(",")):
        m = re.fullmatch(r"(\d+)(?:(-)(\d*))?", item)
        if not m or (m.group(3) and int(m.group(3)) < int(m.group(1))):
            raise BadInput(f"trace_positions item {item!r} is not a position or range",
                           fix='write positions as N, A-B (inclusive) or A- (from A on), comma-separated, '
                               'e.g. "0-15,40-"')
        start = int(m.group(1))
        end = None if m.group(2) and not m.group(3) else int(m.group(3) or start)
        ranges.append((start, end))
    return ranges


def in_positions(ranges: PositionRanges, pos: int) -> bool:
    return any(a <= pos and (b is None or pos <= b) for a, b in ranges)


# Engine arguments the spec owns: the checkpoint the engine *and* the reference load.
ENGINE_ARGS_OWNED = ("model",)
# A threshold above this would let any divergence through (a 1000× ratio is already a broken computation).
MAX_THRESHOLD = 1000.0


@dataclass
class RequestSpec:
    """One request as the user sends it: exactly one of ``prompt``, ``messages``, ``prompt_token_ids``."""

    id: str = ""
    prompt: str | None = None
    messages: list[dict[str, Any]] | None = None   # [{role, content}], rendered by each framework's chat template
    prompt_token_ids: list[int] | None = None
    max_new_tokens: int | None = None              # None: the spec's
    after: str | None = None                       # sent once the request with this id has finished
    # Further sampling parameters of this request (vLLM SamplingParams fields). The diagnosis decodes greedily
    # unless `temperature` is given; the reference is teacher-forced on whatever the engine produced either way.
    sampling: dict[str, Any] = field(default_factory=dict)

    @property
    def kind(self) -> str:
        return next(k for k in INPUT_KINDS if getattr(self, k) is not None)

    def describe(self) -> str:
        """A short human label: the prompt's start, the last message, or the number of ids."""
        if self.prompt is not None:
            text = self.prompt
        elif self.messages is not None:
            text = f"chat, {len(self.messages)} message(s): {self.messages[-1].get('content', '')}"
        else:
            text = f"{len(self.prompt_token_ids or [])} token ids"
        return text if len(text) <= 60 else text[:57] + "…"

    def check(self, where: str) -> None:
        given = [k for k in INPUT_KINDS if getattr(self, k) is not None]
        if len(given) != 1:
            raise BadInput(f"{where} gives {' and '.join(given) if given else 'no input'}",
                           fix="give exactly one of `prompt`, `messages` (chat) or `prompt_token_ids`")
        if self.prompt is not None and (not isinstance(self.prompt, str) or not self.prompt.strip()):
            raise BadInput(f"{where}: empty or non-text prompt {self.prompt!r}", fix="give a non-empty prompt string")
        if self.messages is not None:
            check_messages(self.messages, where)
        if self.prompt_token_ids is not None:
            ids = self.prompt_token_ids
            if not isinstance(ids, list) or not ids or not all(isinstance(t, int) and not isinstance(t, bool)
                                                               and t >= 0 for t in ids):
                raise BadInput(f"{where}: prompt_token_ids must be a non-empty list of non-negative integers",
                               fix="write e.g. prompt_token_ids = [1, 415, 2936]")
        if self.max_new_tokens is not None and (isinstance(self.max_new_tokens, bool)
                                                or not isinstance(self.max_new_tokens, int)
                                                or not 1 <= self.max_new_tokens <= 4096):
            raise BadInput(f"{where}: max_new_tokens {self.max_new_tokens!r} is not an integer in 1..4096",
                           fix="use 1..4096")
        if self.after is not None and not isinstance(self.after, str):
            raise BadInput(f"{where}: `after` must be the id of another request", fix='write after = "first"')
        if not isinstance(self.sampling, dict):
            raise BadInput(f"{where}: `sampling` must be a table of SamplingParams fields",
                           fix="write e.g. sampling = { repetition_penalty = 1.2 }")

    @staticmethod
    def from_json(d: Any, where: str) -> "RequestSpec":
        if not isinstance(d, dict):
            raise BadInput(f"{where} must be a table with prompt, messages or prompt_token_ids",
                           fix='write [[requests]] id = "a" prompt = "…"')
        known = set(RequestSpec.__dataclass_fields__)
        unknown = set(d) - known
        if unknown:
            raise BadInput(f"{where} has unknown keys: {', '.join(sorted(unknown))}",
                           fix=f"use only: {', '.join(sorted(known))}")
        return RequestSpec(**d)


def check_messages(messages: Any, where: str) -> None:
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in messages):
        raise BadInput(f"{where}: messages must be a non-empty list of {{role, content}} tables with text content",
                       fix='write [[messages]] role = "user" content = "…" (one table per message)')


def parse_engine_arg(text: str) -> tuple[str, Any]:
    """``KEY=VALUE`` (``--engine-arg``) → (key, typed value). The value is read as JSON when it parses as JSON
    (``8``, ``0.5``, ``true``, ``null``, ``["none"]``, ``{"mode": 3}``), else kept as text; a value that starts like
    JSON (``{``, ``[``) but does not parse is bad input rather than a string the engine would choke on later."""
    key, sep, raw = text.partition("=")
    key = key.strip().replace("-", "_")
    if not sep or not key or not key.isidentifier():
        raise BadInput(f"--engine-arg {text!r} is not KEY=VALUE",
                       fix="write e.g. --engine-arg max_model_len=2048 or --engine-arg enable_prefix_caching=true")
    raw = raw.strip()
    try:
        return key, json.loads(raw)
    except ValueError as e:
        if raw[:1] in "{[\"":
            raise BadInput(f"--engine-arg {key}: value {raw!r} does not parse ({e})",
                           fix="write a JSON value, e.g. compilation_config='{\"mode\": 3}'") from None
        if raw.lower() in ("true", "false", "none"):
            return key, {"true": True, "false": False, "none": None}[raw.lower()]
        return key, raw


def checkpoint_dtype(model: str) -> str | None:
    """The dtype a local HF checkpoint declares (config.json ``dtype``, or the older ``torch_dtype``)."""
    cfg = Path(model) / "config.json"
    try:
        config = json.loads(cfg.read_text())
    except (OSError, ValueError):
        return None
    text = config.get("dtype") or config.get("torch_dtype") or (config.get("text_config") or {}).get("dtype")
    return str(text).removeprefix("torch.") if text else None


@dataclass
class DiagnosisSpec:
    model: str
    prompts: list[str] = field(default_factory=list)
    target: str = "vllm"
    reference: str = "hf"
    dtype: str = "auto"
    max_new_tokens: int = 8
    # The served configuration: the engine's constructor arguments as the user runs it (vLLM: LLM(**engine_args)).
    engine_args: dict[str, Any] = field(default_factory=dict)
    # One chat request ([{role, content}, …]), rendered by each framework's own chat template.
    messages: list[dict[str, Any]] = field(default_factory=list)
    # Token ids given directly, one list per request.
    prompt_token_ids: list[list[int]] = field(default_factory=list)
    # A scenario: several requests with an order (see RequestSpec); instead of the three fields above.
    requests: list[RequestSpec] = field(default_factory=list)
    # Trace size control: a regex on module paths to record (empty: all), and the dtype tensors are stored in
    # (empty: as computed; "float16"/"bfloat16" halve an fp32 trace).
    trace_modules: str = ""
    trace_store_dtype: str = ""
    # Token positions to record, e.g. "0-15,40-" (see parse_positions; empty: all). Steps with no position in the
    # set are not recorded; each request's last row of a step is always kept (the logits are sampled there).
    trace_positions: str = ""
    # A target trace captured outside Ekka (EKKA_TRACE_DIR under `vllm serve` or the user's own script): the target
    # is not run again, the reference is teacher-forced on that trace's tokens.
    target_trace: str = ""
    # Analysis threshold on the error ratio (DESIGN.md: correct ≤ 1.5, buggy ≥ 3.1; stable 1.5–2.5).
    threshold: float = 2.0

    # -- the requests ---------------------------------------------------------------------------------------
    def request_list(self) -> list[RequestSpec]:
        """Every request of the diagnosis, in order: the scenario's, or one per top-level input (sent together).
        Sequence index i of every trace is request i of this list."""
        if self.requests:
            return [r if r.id else RequestSpec(**{**asdict(r), "id": str(i)}) for i, r in enumerate(self.requests)]
        out = [RequestSpec(id=str(i), prompt=p) for i, p in enumerate(self.prompts)]
        if self.messages:
            out.append(RequestSpec(id=str(len(out)), messages=list(self.messages)))
        out += [RequestSpec(id=str(len(out) + i), prompt_token_ids=list(ids))
                for i, ids in enumerate(self.prompt_token_ids)]
        return out

    def waves(self) -> list[list[int]]:
        """Requests grouped by when they are sent: wave k is sent once every request it waits for has finished
        (a request ``after`` X is in the wave after X's); requests of one wave are sent together."""
        reqs = self.request_list()
        ids = {r.id: i for i, r in enumerate(reqs)}
        wave: dict[int, int] = {}

        def of(i: int, seen: tuple[int, ...] = ()) -> int:
            if i in wave:
                return wave[i]
            r = reqs[i]
            if r.after is None:
                wave[i] = 0
            else:
                if r.after not in ids:
                    raise BadInput(f"request {r.id!r} is sent after {r.after!r}, which no request is called",
                                   fix=f"use one of the request ids: {', '.join(sorted(ids))}")
                j = ids[r.after]
                if j == i or j in seen:
                    raise BadInput(f"requests {r.id!r} and {r.after!r} wait for each other", fix="remove the cycle")
                wave[i] = of(j, seen + (i,)) + 1
            return wave[i]

        for i in range(len(reqs)):
            of(i)
        return [[i for i in range(len(reqs)) if wave[i] == k] for k in range(max(wave.values(), default=-1) + 1)]

    def max_new_tokens_of(self, request: RequestSpec) -> int:
        return request.max_new_tokens or self.max_new_tokens

    def labels(self) -> list[str]:
        """One short label per request (reports, the editor)."""
        return [r.describe() for r in self.request_list()]

    def declared_dtype(self) -> str:
        """What ``auto`` stands for before anything runs: the checkpoint's declared dtype (float32, HF's default,
        when it declares none). The engine resolves ``auto`` itself; the capture records the dtype it really ran in,
        and the reference and the analysis follow that (see :mod:`ekka_core.capture`)."""
        if self.dtype != "auto":
            return self.dtype
        return checkpoint_dtype(self.model) or ("float32" if Path(self.model).exists() else "bfloat16")

    # -- validation -----------------------------------------------------------------------------------------
    def validate(self) -> "DiagnosisSpec":
        self._check_types()
        if not self.model:
            raise BadInput("no model given", fix="pass --model DIR_OR_ID (a local HF checkpoint directory)")
        path = Path(self.model)
        if not path.exists() and (self.model.startswith((".", "/")) or self.model.count("/") != 1):
            raise BadInput(f"model path {self.model!r} does not exist",
                           fix="pass a local HF checkpoint directory (config.json + weights)")
        if path.exists() and not (path / "config.json").exists():
            raise BadInput(f"{self.model} has no config.json", fix="pass the directory of a HF checkpoint")
        if self.target not in TARGETS:
            raise BadInput(f"unknown target {self.target!r}", fix=f"use --target {' or '.join(TARGETS)}")
        if self.reference not in REFERENCES:
            raise BadInput(f"unknown reference {self.reference!r}", fix="use --reference hf")
        if self.dtype not in SPEC_DTYPES:
            raise BadInput(f"unsupported dtype {self.dtype!r}", fix=f"use one of {', '.join(SPEC_DTYPES)}")
        if self.target_trace and not any((d / "index.json").exists() for d in
                                         (Path(self.target_trace), Path(self.target_trace) / "rank-0")):
            raise BadInput(f"target trace {self.target_trace} has no index.json",
                           fix="pass the EKKA_TRACE_DIR the engine wrote (with TP, the directory holding rank-*/)")
        self._check_inputs()
        if not (1 <= self.max_new_tokens <= 4096):
            raise BadInput(f"--max-new-tokens {self.max_new_tokens} is out of range", fix="use 1..4096")
        return self

    def _check_inputs(self) -> None:
        shorthand = [name for name in ("prompts", "messages", "prompt_token_ids") if getattr(self, name)]
        if self.requests and shorthand:
            raise BadInput(f"the spec gives both `requests` and `{shorthand[0]}`",
                           fix="list every request under [[requests]], or drop `requests`")
        if "prompts" in shorthand and "messages" in shorthand:
            raise BadInput("the spec gives both `prompt(s)` and `messages`",
                           fix="give prompt text or a chat conversation, not both (or use [[requests]] for a mix)")
        if any(isinstance(p, str) and not p.strip() for p in self.prompts):
            raise BadInput("empty prompt", fix="pass at least one non-empty --prompt TEXT")
        reqs = self.request_list()
        if not reqs:
            raise BadInput("no prompt given (nor chat messages, token ids or requests)",
                           fix="pass --prompt TEXT, or give prompts, messages, prompt_token_ids or [[requests]] in the spec")
        seen: set[str] = set()
        for i, r in enumerate(reqs):
            r.check(f"request {r.id!r}" if self.requests else f"input {i}")
            if r.id in seen:
                raise BadInput(f"two requests are called {r.id!r}", fix="give every request its own id")
            seen.add(r.id)
        self.waves()

    def _check_types(self) -> None:
        """Spec files arrive untyped: wrong types are bad input (exit 2), never a crash later on."""
        def bad(field_: str, want: str) -> BadInput:
            return BadInput(f"spec field `{field_}` must be {want}, got {getattr(self, field_)!r}",
                            fix=f"write `{field_}` as {want}")
        for name in ("model", "target", "reference", "dtype", "trace_modules", "trace_store_dtype",
                     "trace_positions", "target_trace"):
            if not isinstance(getattr(self, name), str):
                raise bad(name, "a string")
        if isinstance(self.prompts, str) or not isinstance(self.prompts, list) \
                or not all(isinstance(p, str) for p in self.prompts):
            raise bad("prompts", 'a list of strings, e.g. prompts = ["first", "second"]')
        if not isinstance(self.messages, list):
            raise bad("messages", 'a list of {role, content} tables')
        if self.messages:
            check_messages(self.messages, "messages")
        if not isinstance(self.prompt_token_ids, list) or not all(isinstance(x, list) for x in self.prompt_token_ids):
            raise bad("prompt_token_ids", "a list of token-id lists, e.g. prompt_token_ids = [[1, 415, 2936]]")
        if not isinstance(self.requests, list) or not all(isinstance(r, RequestSpec) for r in self.requests):
            raise bad("requests", "a list of [[requests]] tables")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise bad("max_new_tokens", "an integer")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) \
                or not math.isfinite(self.threshold) or not 1 < self.threshold <= MAX_THRESHOLD:
            raise bad("threshold", f"a finite number above 1 and at most {MAX_THRESHOLD:g} (the error ratio of a "
                                   "correct component is ≈ 1; the paper's stable range is 1.5–2.5)")
        if self.trace_store_dtype and self.trace_store_dtype not in DTYPES:
            raise BadInput(f"trace_store_dtype {self.trace_store_dtype!r} is not a dtype",
                           fix=f"use one of {', '.join(DTYPES)} or leave it empty")
        if self.trace_modules:
            try:
                re.compile(self.trace_modules)
            except re.error as e:
                raise BadInput(f"trace_modules is not a valid regular expression ({e})",
                               fix="write a Python regex matching module paths, e.g. 'layers\\.(0|1)\\.'") from None
        if self.trace_positions:
            parse_positions(self.trace_positions)
        if not isinstance(self.engine_args, dict):
            raise bad("engine_args", "a table, e.g. [engine_args] max_model_len = 1024")
        bad_keys = [k for k in self.engine_args if not isinstance(k, str) or not k.isidentifier()]
        if bad_keys:
            raise BadInput(f"engine_args has keys that are not argument names: {bad_keys}",
                           fix="write engine arguments by their Python name, e.g. max_num_batched_tokens = 64")
        # The checkpoint is the spec's `model`: an engine argument naming another one would serve a model the
        # reference never sees, and the comparison would be between two different models.
        replaced = [k for k in ENGINE_ARGS_OWNED if k in self.engine_args]
        if replaced:
            raise BadInput(f"engine_args sets {', '.join(replaced)}, which the spec itself decides (the checkpoint "
                           "both the engine and the reference load)",
                           fix="give the checkpoint with --model (or the spec's `model`), and drop "
                               + ", ".join(f"{k}=" for k in replaced) + " from the engine arguments")

    # -- serialisation --------------------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @staticmethod
    def from_json(data: dict[str, Any], *, where: str = "spec") -> "DiagnosisSpec":
        """A spec from JSON or TOML data: ``prompt`` (one) joins ``prompts``; ``prompt_token_ids`` may be one id list;
        ``requests`` become :class:`RequestSpec`. Unknown keys and wrong shapes are bad input naming the key."""
        if not isinstance(data, dict):
            raise BadInput(f"{where} is not a table of spec fields", fix="give at least `model` and `prompts`")
        data = dict(data)
        known = set(DiagnosisSpec.__dataclass_fields__)
        unknown = set(data) - known - {"prompt"}
        if unknown:
            raise BadInput(f"{where} has unknown keys: {', '.join(sorted(unknown))}",
                           fix=f"use only: {', '.join(sorted(known))}")
        if "prompt" in data:
            prompts = data.get("prompts", [])
            data["prompts"] = (list(prompts) if isinstance(prompts, list) else [prompts]) + [data.pop("prompt")]
        ids = data.get("prompt_token_ids")
        if isinstance(ids, list) and ids and all(isinstance(t, int) for t in ids):
            data["prompt_token_ids"] = [ids]          # one request's ids
        reqs = data.get("requests")
        if reqs is not None:
            if not isinstance(reqs, list):
                raise BadInput(f"{where}: `requests` must be a list of [[requests]] tables",
                               fix='write [[requests]] id = "a" prompt = "…"')
            data["requests"] = [RequestSpec.from_json(r, f"{where}: requests[{i}]") for i, r in enumerate(reqs)]
        try:
            return DiagnosisSpec(**data)
        except TypeError as e:
            raise BadInput(f"{where}: {e}", fix="give at least `model` and `prompts`") from None

    def trace_options(self) -> dict[str, str]:
        return {"include": self.trace_modules, "store_dtype": self.trace_store_dtype,
                "positions": self.trace_positions}

    def fingerprint(self, *, without: tuple[str, ...] = ()) -> str:
        """Identifies the inputs of a capture: equal fingerprints ⇒ traces can be reused. ``without``: fields that
        do not reach the run being fingerprinted (a run given its engine arguments explicitly does not read
        ``engine_args``; an untraced run reads no trace option), so that editing them costs only what they change."""
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "threshold" and k not in without},
                          sort_keys=True)
        model_stamp = ""
        cfg = Path(self.model) / "config.json"
        if cfg.exists():
            model_stamp = hashlib.sha256(cfg.read_bytes()).hexdigest()
            for w in sorted(Path(self.model).glob("*.safetensors")):
                st = w.stat()
                model_stamp += f"{w.name}:{st.st_size}:{st.st_mtime_ns}"
        return hashlib.sha256((blob + model_stamp).encode()).hexdigest()[:16]

    @staticmethod
    def from_toml(path: Path | str) -> "DiagnosisSpec":
        path = Path(path)
        try:
            data = tomllib.loads(path.read_text())
        except FileNotFoundError:
            raise BadInput(f"spec file {path} does not exist", fix="pass an existing .ekka.toml file") from None
        except (OSError, UnicodeDecodeError) as e:
            raise BadInput(f"spec file {path} cannot be read ({e})", fix="check the path and permissions") from None
        except tomllib.TOMLDecodeError as e:
            raise BadInput(f"spec file {path} is not valid TOML ({e})", fix="fix the syntax at that line") from None
        if isinstance(data.get("model"), str) and data["model"] and not Path(data["model"]).is_absolute() \
                and (path.parent / data["model"]).exists():
            data["model"] = str((path.parent / data["model"]).resolve())
        return DiagnosisSpec.from_json(data, where=f"spec file {path}")

