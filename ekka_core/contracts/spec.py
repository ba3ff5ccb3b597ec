"""DiagnosisSpec: everything that defines one diagnosis. Built from CLI flags or a TOML spec file."""

from __future__ import annotations

import hashlib
import json
import re
import tomllib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from ekka_core.contracts.errors import BadInput

TARGETS = ("vllm", "sglang")
REFERENCES = ("hf",)
DTYPES = ("bfloat16", "float16", "float32")


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


@dataclass
class DiagnosisSpec:
    model: str
    prompts: list[str]
    target: str = "vllm"
    reference: str = "hf"
    dtype: str = "bfloat16"
    max_new_tokens: int = 8
    # Passed to the target engine's constructor (vLLM: LLM(**engine_args)), e.g. max_model_len.
    engine_args: dict[str, Any] = field(default_factory=dict)
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
        if self.dtype not in DTYPES:
            raise BadInput(f"unsupported dtype {self.dtype!r}", fix=f"use one of {', '.join(DTYPES)}")
        if self.target_trace and not any((d / "index.json").exists() for d in
                                         (Path(self.target_trace), Path(self.target_trace) / "rank-0")):
            raise BadInput(f"target trace {self.target_trace} has no index.json",
                           fix="pass the EKKA_TRACE_DIR the engine wrote (with TP, the directory holding rank-*/)")
        if not self.prompts or any(not p.strip() for p in self.prompts):
            raise BadInput("empty prompt", fix="pass at least one non-empty --prompt TEXT")
        if not (1 <= self.max_new_tokens <= 4096):
            raise BadInput(f"--max-new-tokens {self.max_new_tokens} is out of range", fix="use 1..4096")
        return self

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
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int):
            raise bad("max_new_tokens", "an integer")
        if isinstance(self.threshold, bool) or not isinstance(self.threshold, (int, float)) or self.threshold <= 1:
            raise bad("threshold", "a number above 1 (the error ratio of a correct component is ≈ 1)")
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

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    def trace_options(self) -> dict[str, str]:
        return {"include": self.trace_modules, "store_dtype": self.trace_store_dtype,
                "positions": self.trace_positions}

    def fingerprint(self) -> str:
        """Identifies the inputs of a capture: equal fingerprints ⇒ traces can be reused."""
        blob = json.dumps({k: v for k, v in asdict(self).items() if k != "threshold"}, sort_keys=True)
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
        known = set(DiagnosisSpec.__dataclass_fields__)
        unknown = set(data) - known - {"prompt"}
        if unknown:
            raise BadInput(f"spec file {path} has unknown keys: {', '.join(sorted(unknown))}",
                           fix=f"use only: {', '.join(sorted(known))}")
        if "prompt" in data:
            data.setdefault("prompts", []).append(data.pop("prompt"))
        if isinstance(data.get("model"), str) and data["model"] and not Path(data["model"]).is_absolute() \
                and (path.parent / data["model"]).exists():
            data["model"] = str((path.parent / data["model"]).resolve())
        try:
            return DiagnosisSpec(**data)
        except TypeError as e:
            raise BadInput(f"spec file {path}: {e}", fix="give at least `model` and `prompts`") from None
