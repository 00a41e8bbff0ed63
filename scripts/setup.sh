#!/usr/bin/env bash
# One-shot, idempotent set-up: apt packages, virtual environment, Python packages, model assembly.
# A second run with nothing changed returns in well under a second (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test,llm,hf,otel,cluster}
APT_PACKAGES=(apertium apertium-eng-spa apertium-fr-es apertium-eng-cat apertium-fra-cat apertium-es-pt espeak-ng
  liblouis-bin liblouis-data redis-server fonts-dejavu-core tesseract-ocr tesseract-ocr-eng libgl1 libglib2.0-0
  chromium chromium-driver)

stamp_key=$( { cat pyproject.toml requirements/*.txt scripts/setup.sh; echo "$EXTRAS ${APT_PACKAGES[*]}"; } | sha256sum | cut -c1-16)
stamp="$VENV/.linguafusion-setup-$stamp_key"
if [ -f "$stamp" ] && [ -x "$VENV/bin/linguafusion" ]; then
  exit 0
fi

missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "[setup] apt-get install ${missing[*]}"
  SUDO=""; [ "$(id -u)" = 0 ] || SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
PIP=("$VENV/bin/python" -m pip install -q --disable-pip-version-check)
"${PIP[@]}" --upgrade pip >/dev/null
if [[ ",$EXTRAS," == *",hf,"* ]]; then
  # The CPU build of torch lies on this machine's disk; ask for it first so nothing pulls a CUDA build.
  "${PIP[@]}" "torch==2.13.0" -c requirements/constraints-core.txt
fi
if [[ ",$EXTRAS," == *",llm,"* ]]; then
  echo "[setup] llama-cpp-python (compiles once, ~10 min on a fresh machine; pip caches the wheel)"
fi
echo "[setup] pip install -e .[$EXTRAS]"
"${PIP[@]}" -e ".[$EXTRAS]" -c requirements/constraints-core.txt

# sign and lip landmarks: mediapipe 0.10.21 needs numpy<2, so it gets its own environment; the server runs it as a
# worker process (src/lingua_fusion/vision/worker.py). VISION=0 skips it (the vision tests then fail under CI).
VISION_VENV=${VISION_VENV:-.venv-vision}
if [ "${VISION:-1}" != 0 ] && ! "$VISION_VENV/bin/python" -c "import mediapipe" 2>/dev/null; then
  echo "[setup] creating $VISION_VENV (mediapipe 0.10.21, numpy<2; about 3 minutes)"
  python3.11 -m venv "$VISION_VENV" 2>/dev/null || python3 -m venv "$VISION_VENV"
  # the worker needs only mediapipe and numpy (not the core set of requirements-vision.txt)
  "$VISION_VENV/bin/python" -m pip install -q --disable-pip-version-check "mediapipe==0.10.21" "numpy<2" \
    -c requirements/constraints-vision.txt
fi

echo "[setup] assembling models into the cache directory"
"$VENV/bin/python" -m lingua_fusion.models.assets
rm -f "$VENV"/.linguafusion-setup-*
touch "$stamp"
echo "[setup] done"
