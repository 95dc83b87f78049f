#!/bin/bash
export PYTHONPATH=$PWD/src
python .device/attn_var2.py 2>&1 | grep probe
NOSPEC=1 python .device/attn_var2.py 2>&1 | grep probe
echo "== ours now"
timeout 120 python .device/attn_llama.py 2>&1 | tail -3
rm -rf /tmp/vB && mkdir -p /tmp/vB && cp -r src /tmp/vB/
sed -i 's/NOT_SPECIALIZED = \["n_q", "n_k",/NOT_SPECIALIZED = ["n_k",/' /tmp/vB/src/triton_workshop/ops/attention/configs.py
grep -n "^NOT_SPECIALIZED" /tmp/vB/src/triton_workshop/ops/attention/configs.py
echo "== ours, n_q specialised"
PYTHONPATH=/tmp/vB/src timeout 120 python .device/attn_llama.py 2>&1 | tail -3
