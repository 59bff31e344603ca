set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 3
export PYTHONPATH=$PWD/.gpu/stubs:/tmp/site:$PWD HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee $OUT/env.txt
start=$(date +%s.%N); echo "start $start" > $OUT/train-timeline.txt
timeout 330 python3 -m distill train --config configs/train/bert-large-gpu.yaml --model.random_init true --wandb_mode disabled --checkpoint_root /tmp/runs 2>&1 | while IFS= read -r line; do echo "$(date +%s.%N) $line"; done | tee $OUT/train.log | grep -v "Loading\|Writing" | tail -40
echo "exit ${PIPESTATUS[0]} $(date +%s.%N)" >> $OUT/train-timeline.txt
cp /tmp/runs/bert-large-dl2122-cis-gpu/logs/metrics.csv $OUT/train-metrics.csv 2>/dev/null
ls -la /tmp/runs/bert-large-dl2122-cis-gpu/ /tmp/runs/bert-large-dl2122-cis-gpu/checkpoints >> $OUT/train-timeline.txt
