# Sourced by bench/gpu_product.sh and bench/gpu_arms.sh on the GPU machine, from the .gpurun bundle:
#   source bench/gpu_setup.sh OUTDIR H200_STREAMS OTHER_STREAMS
# Makes OUTDIR, installs the carried wheels, exports the server's environment (PACE: the partial pace), writes the
# random-weight Marian directory, and sets out, gpu, m (model processes: 6 on an H200's 141 GB, 3 on an H100's 80 GB,
# where 6 ran it out of memory) and streams (STREAMS, else the default for the card).
set -u
out=${1:?output directory}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD/src PYTHONUNBUFFERED=1 LINGUAFUSION_SERVER__PARTIAL_PACE=${PACE:-2.5}
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
case "$gpu" in
  *H200*) m=6; streams=${STREAMS:-$2} ;;
  *) m=3; streams=${STREAMS:-$3} ;;
esac
python3 bench/gpu_mt_dir.py model mt-en-es | tail -1
