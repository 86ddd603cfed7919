#!/bin/bash
set -u
export PYTHONPATH=/tmp/site:$PWD/src
D=data/textbridge_minilm; R=/tmp/rt; mkdir -p $OUT/rt
ls $R/enc_minilm/checkpoints $R/dec_minilm/checkpoints
python3 -m sweeplab.families.textbridge_decoder.roundtrip --encoder $R/enc_minilm/checkpoints/last.ckpt \
  --decoder $R/dec_minilm/checkpoints/last.ckpt --data $D --teacher none --out $OUT/rt/roundtrip.json 2>&1 | tail -15
