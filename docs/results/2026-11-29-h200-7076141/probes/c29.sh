#!/bin/bash
export PYTHONPATH=$PWD/src
timeout 110 python -m pytest -p no:cacheprovider -q -rfE -n 8 tests/test_attention.py -k "matches_float64_reference or every_dkdv_tile_shape" > $OUT/tests.log 2>&1; echo "tests rc $?" >> $OUT/tests.log
grep -E "rc |passed|failed|FAIL|Error" $OUT/tests.log | cut -c1-200 | tail -8
B="python -m triton_workshop.cli bench models"
timeout 300 $B --models llama_train --candidates "torch.compile,torch.compile + triton-workshop" --timeout 150 --out $OUT/llama-compiled > $OUT/llama-compiled.log 2>&1; echo "rc $?" >> $OUT/llama-compiled.log
cd $OUT && tar czf csv.tgz llama-compiled 2>/dev/null; rm -rf llama-compiled; cd - > /dev/null
grep -E "│|rc |Error|ms/step \(" $OUT/llama-compiled.log | cut -c1-230 | tail -14
