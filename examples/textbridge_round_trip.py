"""Text -> TextBridge encoder -> cube -> decoder -> text, in a few lines, once both are trained on the same data:

    python -m sweeplab.train model=textbridge hydra.run.dir=runs/encoder
    python -m sweeplab.train model=textbridge_decoder optim.lr=2e-3 hydra.run.dir=runs/decoder
    python examples/textbridge_round_trip.py runs/encoder/checkpoints/last.ckpt runs/decoder/checkpoints/last.ckpt

(`python -m sweeplab.families.textbridge_decoder.roundtrip` scores a whole held-out split the same way.)
"""

import sys

from sweeplab.data.tokenizer import TextTokenizer
from sweeplab.families.loading import load_model
from sweeplab.families.textbridge_decoder.roundtrip import decode, encode

encoder = load_model(sys.argv[1], expect_family="textbridge").model
decoder = load_model(sys.argv[2], expect_family="textbridge_decoder").model
tokenizer = TextTokenizer.load(sys.argv[3] if len(sys.argv) > 3 else "data/textbridge_demo/tokenizer.json")

texts = ["The import statement initialises a module.", "A function may return several values as a tuple."]
cubes = encode(encoder, tokenizer, texts)  # text -> cube: (2, out_dim), the teacher's embedding space
for text, ids in zip(texts, decode(decoder, cubes)):  # cube -> token ids, greedily
    print(f"{text}\n  -> {tokenizer.decode([ids])[0]}")
