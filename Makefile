# The two commands of the README.
.PHONY: run test setup

setup:
	bash scripts/setup.sh

run: setup
	.venv/bin/vtui

test: setup
	bash scripts/test.sh
