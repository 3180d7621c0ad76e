# Shortcuts; each needs only Python 3.11+ (see README).
.PHONY: run test schemas
run:
	python3 scripts/dev.py run
test:
	python3 scripts/dev.py test
schemas:
	.venv/bin/whaleflux schemas
