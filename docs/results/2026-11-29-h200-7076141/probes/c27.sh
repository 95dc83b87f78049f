#!/bin/bash
export PYTHONPATH=$PWD/src
for v in B C; do
rm -rf /tmp/v$v && mkdir -p /tmp/v$v && cp -r src /tmp/v$v/
done
sed -i 's/NOT_SPECIALIZED = \["n_q", "n_k",/NOT_SPECIALIZED = ["n_k",/' /tmp/vB/src/triton_workshop/ops/attention/configs.py
sed -i 's/NOT_SPECIALIZED = \["n_q", "n_k",/NOT_SPECIALIZED = [/' /tmp/vC/src/triton_workshop/ops/attention/configs.py
grep -h "^NOT_SPECIALIZED" /tmp/v?/src/triton_workshop/ops/attention/configs.py
for v in B C; do
echo "== v$v shipped table"
PYTHONPATH=/tmp/v$v/src timeout 120 python .device/attn_llama.py 2>&1 | grep -E "ours:|attn_bwd_dkdv_kernel [0-9]|dkdv_kernel \(2048"
done
echo "== vC, autotuned (no table)"
TRITON_WORKSHOP_TUNED=0 PYTHONPATH=/tmp/vC/src timeout 200 python .device/attn_llama.py 2>&1 | grep -E "ours:|attn_bwd_dkdv_kernel [0-9]|dkdv_kernel \(2048"
