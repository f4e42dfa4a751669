# Shortcuts; each target runs one of the scripts in scripts/ (as root).
.PHONY: demo test bench bench-quick
demo:
	./scripts/demo.sh
test:
	./scripts/test.sh
bench:
	./scripts/bench.sh
bench-quick:
	./scripts/bench.sh --quick
