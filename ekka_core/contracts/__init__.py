"""The contracts layer: every artefact that crosses a stage, a process or a file, defined once, torch-free.

Light processes (the language server, its worker protocol, the remote client, the CLI before a run starts) import
only this package for data; the stages import it for their inputs and outputs. Each artefact is a dataclass with a
JSON round-trip, versioned (a ``schema`` string) where it is written to a file or sent to another process.

``errors``       EkkaError / BadInput / InternalFailure and the error envelope every process boundary uses
``spec``         DiagnosisSpec (what to diagnose): inputs as prompts, chat messages or token ids; request scenarios;
                 the served engine configuration
``trace_index``  a trace's index (run metadata, steps, module calls), readable without torch
``mapping``      target ↔ reference component pairs, unmapped components with an explicit status
``alignment``    a pair the align stage could not align: the component and why
``ranking``      per-pair results, suspects, the ranking analysis hands to the report
``report``       the ``ekka.report/1`` schema's headline (and its short form), error-ratio formatting
``env``          the ``EKKA_*`` environment a diagnosis may be handed from outside (editor, remote job)
"""
