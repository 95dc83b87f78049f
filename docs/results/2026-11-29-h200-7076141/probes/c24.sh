set -x
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src
timeout 200 python .device/attn_var.py 2>&1 | grep -v Warning
# ours with unmasked row loads in the dK/dV loop's full tiles
rm -rf /tmp/vA && mkdir -p /tmp/vA && cp -r src /tmp/vA/
sed -i 's/q = load_rows(q_ptrs, offs_m, q_len, mask_d, True, EVEN_D)/q = load_rows(q_ptrs, offs_m, q_len, mask_d, MASKED, EVEN_D)/; s/do = load_rows(do_ptrs, offs_m, q_len, mask_d, True, EVEN_D)/do = load_rows(do_ptrs, offs_m, q_len, mask_d, MASKED, EVEN_D)/' /tmp/vA/src/triton_workshop/ops/attention/kernel_loops.py
grep -n "load_rows(q_ptrs\|load_rows(do_ptrs" /tmp/vA/src/triton_workshop/ops/attention/kernel_loops.py
echo "== ours, unmasked full-tile loads"
PYTHONPATH=/tmp/vA/src timeout 120 python .device/attn_llama.py 2>&1 | tail -3
echo "== ours, shipped"
timeout 120 python .device/attn_llama.py 2>&1 | tail -3
