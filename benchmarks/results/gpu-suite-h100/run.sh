set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 3
export PYTHONPATH=$PWD/.gpu/stubs:/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/env.txt
git log -1 --format=%H >> $OUT/env.txt 2>/dev/null
timeout 100 python3 -m pytest -q -p no:cacheprovider tests/test_cuda_graphs.py 2>&1 | tail -25 | tee $OUT/cuda-graphs-tests.txt
timeout 400 python3 benchmarks/gpu_suite.py --profile --out $OUT/suite 2>&1 | tee $OUT/suite.log | tail -60
cd $OUT && tar -cJf suite.tar.xz suite && rm -rf suite
