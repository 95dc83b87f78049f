#!/bin/bash
export PYTHONPATH=$PWD/src
cp src/triton_workshop/runtime/tuned/sm90.json $OUT/sm90.json
timeout 200 python -m triton_workshop.cli tune -k attention --dtypes bfloat16,float16 --out $OUT/sm90.json > $OUT/tune.log 2>&1; echo "tune rc $?" >> $OUT/tune.log
tail -3 $OUT/tune.log
cp $OUT/sm90.json src/triton_workshop/runtime/tuned/sm90.json
timeout 100 python .device/attn_llama.py > $OUT/attn-llama.log 2>&1
grep -E "ours:|sdpa:|attn_bwd_dkdv_kernel [0-9]" $OUT/attn-llama.log
timeout 230 python -m pytest -p no:cacheprovider -q -rfE -n 12 tests/test_attention.py tests/test_attention_features.py > $OUT/tests.log 2>&1; echo "tests rc $?" >> $OUT/tests.log
grep -E "rc |passed|failed|FAIL|Error" $OUT/tests.log | cut -c1-200 | tail -12
