# Thin wrappers over the scripts: `make test` is what CI runs (.ci/run).
.PHONY: setup test demo bench

setup:
	bash scripts/setup.sh

test:
	bash scripts/test.sh

demo: setup
	.venv/bin/ekka demo

bench: setup
	.venv/bin/ekka bench
