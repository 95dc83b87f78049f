#!/bin/bash
nvidia-smi -L
export PYTHONPATH=$PWD/src
echo "== attention at the Llama shape, shipped table"
timeout 120 python .device/attn_llama.py 2>&1 | tail -3
cp src/triton_workshop/runtime/tuned/sm90.json $OUT/sm90.json
echo "== tune attention"
timeout 300 python -m triton_workshop.cli tune -k attention --dtypes bfloat16,float16 --out $OUT/sm90.json > $OUT/tune.log 2>&1; echo "tune rc $?" >> $OUT/tune.log
tail -16 $OUT/tune.log
echo "== attention at the Llama shape, retuned table"
TRITON_WORKSHOP_TUNED_DIR=$OUT timeout 120 python .device/attn_llama.py 2>&1 | tail -3
timeout 200 python -m pytest -p no:cacheprovider -q -rfE -n 8 tests/test_attention.py tests/test_attention_features.py > $OUT/tests.log 2>&1; echo "tests rc $?" >> $OUT/tests.log
grep -E "rc |passed|failed|FAIL|Error" $OUT/tests.log | cut -c1-200 | tail -12
