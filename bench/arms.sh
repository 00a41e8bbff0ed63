# Sourced by bench/gpu_arms.sh and bench/cpu_arms.sh: one arm of an A/B, NAME=VAR:VALUE,VAR:VALUE ("-" for none).
#   arm_env "$arm"   # sets name (NAME) and envs (LINGUAFUSION_VAR=VALUE ..., for `env "${envs[@]}" cmd`)
arm_env() {
  name=${1%%=*}
  envs=()
  if [[ ${1#*=} != "-" ]]; then
    local pairs pair
    IFS=, read -ra pairs <<< "${1#*=}"
    for pair in "${pairs[@]}"; do envs+=("LINGUAFUSION_${pair%%:*}=${pair#*:}"); done
  fi
}
