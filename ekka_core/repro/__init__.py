"""Import a user's vLLM or SGLang reproduction script as a DiagnosisSpec — by reading it, never by running it.

``import_repro(path)`` parses the script with libcst, finds the engine constructor (``LLM(...)``, ``vllm.LLM(...)``,
``sgl.Engine(...)``) and the calls that generate with it (``llm.generate``, ``llm.chat``, ``engine.generate``), and
evaluates the arguments that matter when they are literals or simple name bindings (``PROMPTS = [...]``,
``MODEL = "org/name"``, ``"a" + "b"``, f-strings without substitutions, ``["x"] * 2``, literal ``**{...}`` splats,
a ``for prompt in PROMPTS:`` loop). Anything whose value only exists when the script runs becomes an
:class:`Unknown` with its line, source snippet and a hint; the importer never guesses a value.

What it writes: every engine keyword as ``engine_args`` (the served configuration); the inputs as the script sends
them — prompt text, chat ``messages``, ``prompt_token_ids`` — and, when the script generates several times in a row,
a request scenario (``requests`` with ``after``). ``to_toml(fields)`` writes a ``.ekka.toml`` that
:meth:`DiagnosisSpec.from_toml` loads back, with the stdlib only.

By responsibility: :mod:`.importer` (:func:`import_repro` and its :class:`ReproImport`), :mod:`.script` (parsing,
literal evaluation, run-time values), :mod:`.engine` (the engine and its arguments), :mod:`.requests` (the
generation calls and their inputs), :mod:`.toml` (the spec file).
"""

from __future__ import annotations

from ekka_core.repro.importer import INPUT_FIELDS, ReproImport, import_repro
from ekka_core.repro.script import Unknown
from ekka_core.repro.toml import to_toml

__all__ = ["ReproImport", "Unknown", "import_repro", "to_toml"]
