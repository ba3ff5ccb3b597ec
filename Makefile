# Thin wrappers over the scripts: `make test` is what CI runs (.ci/run).
.PHONY: setup test demo bench

setup:
	bash scripts/setup.sh

test:
	bash scripts/test.sh

# `ekka demo` exits 1 when it finds the bug (verdict divergent, as `ekka diagnose` does): that is the demo working;
# exit 0 (consistent) would mean the re-injected bug went unseen, so only 1 passes.
demo: setup
	.venv/bin/ekka demo; test $$? -eq 1

bench: setup
	.venv/bin/ekka bench
