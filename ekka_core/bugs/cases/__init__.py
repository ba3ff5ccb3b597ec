"""The bug cases, one module each: its :class:`~ekka_core.bugs.bug.Bug` as ``BUG`` and the injection that
re-creates it. :mod:`ekka_core.bugs.registry` discovers them and fixes their order."""
