"""Real historical silent errors of vLLM, re-injected into the installed vLLM for demos and the benchmark.

Each bug names its source (issue / fix PR), the zoo architecture that shows it, and the component a correct
diagnosis must rank first. Injection happens inside vLLM's own processes through Ekka's ``vllm.general_plugins``
entry point (:mod:`ekka_core.capture.vllm_plugin`), selected by ``EKKA_INJECT_BUG=<name>``; nothing is edited on
disk and no other plugin is affected.

Layout: :mod:`~ekka_core.bugs.bug` (the :class:`Bug` record), :mod:`~ekka_core.bugs.registry` (:data:`BUGS`, in
benchmark order), :mod:`~ekka_core.bugs.cases` (one module per case), and the helpers the cases share:
:mod:`~ekka_core.bugs.prompts`, :mod:`~ekka_core.bugs.vllm_access` (vLLM only through
:mod:`ekka_core.capture.vllm_compat`, imported when an injection runs), :mod:`~ekka_core.bugs.reattend`.
"""

from ekka_core.bugs.bug import Bug
from ekka_core.bugs.prompts import CHAT_MESSAGES, CHUNKED_PROMPT, DEFAULT_PROMPTS, LONG_PROMPT, SHARED_PREFIX
from ekka_core.bugs.registry import BUGS, ENV_VAR, get, matches

__all__ = ["BUGS", "Bug", "ENV_VAR", "get", "matches", "CHAT_MESSAGES", "CHUNKED_PROMPT", "DEFAULT_PROMPTS",
           "LONG_PROMPT", "SHARED_PREFIX"]
