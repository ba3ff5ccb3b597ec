# Thin wrappers over the scripts: `make test` is what CI runs (.ci/run).
.PHONY: setup test demo bench

setup:
	bash scripts/setup.sh

test:
	bash scripts/test.sh

# `ekka demo` exits 1 when it finds the bug (verdict divergent, as `ekka diagnose` does): that is the demo working.
demo: setup
	.venv/bin/ekka demo || [ $$? -eq 1 ]

bench: setup
	.venv/bin/ekka bench
